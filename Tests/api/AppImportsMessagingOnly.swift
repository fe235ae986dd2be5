// An app that imports Messaging and nothing else names every type the public signatures it uses
// show (issue 46, 5): the listener's settings, an accepted socket, a service found by browsing.
// Tests/api/check-api.sh type-checks it.
import Logging
import Messaging

func listenOnOnePort() -> ServerConfiguration {
    var configuration = ServerConfiguration(serviceType: "_kv._tcp", serviceName: "Board")
    var listener: ListenerConfiguration = configuration.listener
    listener.port = 4242
    listener.loopbackOnly = true
    configuration.listener = listener
    return configuration
}

func acceptByHand(_ socket: AcceptedSocket, logger: Logger) async throws -> MessageChannel {
    try await MessageChannel.accept(socket, configuration: ChannelConfiguration(name: "board"), logger: logger)
}

func findTheBoard(logger: Logger) async throws -> String {
    let discovery = ServiceDiscovery(logger: logger)
    let found: DiscoveredService = try await MessageClient.find(name: "Board", type: "_kv._tcp", discovery: discovery, timeout: .seconds(3))
    return found.name
}
