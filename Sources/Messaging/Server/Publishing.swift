import Discovery

/// What a ``MessageServer`` needs from discovery: publish a service and later withdraw it. The
/// server uses `ServiceDiscovery`; tests of the server's lifecycle give it a publisher they control.
package protocol ServicePublisher: Sendable {
    func publishService(name: String?, type: String, port: UInt16, txt: TXTRecord) async throws(DiscoveryError)
        -> any ServicePublication
}

/// A published service as the server sees it.
package protocol ServicePublication: Sendable {
    var events: AsyncStream<PublicationEvent> { get }
    var name: String { get }
    func updateTXT(_ txt: TXTRecord) async throws(DiscoveryError)
    func unpublish() async
}

extension ServiceDiscovery: ServicePublisher {
    package func publishService(name: String?, type: String, port: UInt16, txt: TXTRecord) async throws(DiscoveryError)
        -> any ServicePublication
    {
        try await publish(name: name, type: type, port: port, txt: txt)
    }
}

extension PublishedService: ServicePublication {}
