// An encrypted server and client with long-term identities: the server lets in only the
// client key it pinned, the client trusts the server on first use, both sides see the same
// comparison code, and a server that presents another key under the same name is refused.

import Foundation
import Logging
import Messaging

// snippet.hide
// Bounded: this program ends within 10 seconds whatever happens.
DispatchQueue.global().asyncAfter(deadline: .now() + 10) {
    print("security: timed out")
    exit(1)
}
var logger = Logger(label: "security")
logger.logLevel = .critical  // the refused impostor below would log a loud warning
let directory = NSTemporaryDirectory() + "lanmsg-security-\(getpid())"
// snippet.show

// snippet.identities
// Long-term identities: Curve25519 key pairs, created on first use (file mode 0600).
// By default (`ChannelSecurity.standard`) they live in `$XDG_DATA_HOME/lanmsg/<program>/`.
let serverIdentity = try Identity.loadOrCreate(at: directory + "/server/identity")
let clientIdentity = try Identity.loadOrCreate(at: directory + "/client/identity")
print("server key \(serverIdentity.fingerprint), client key \(clientIdentity.fingerprint)")

// Optional: a pre-shared key on both sides (the handshake becomes Noise XXpsk3).
let key = try PreSharedKey(bytes: Array("a key file's bytes, 16 or more".utf8))
// snippet.end

// snippet.server
// The server accepts only the client key it pinned.
var serverConfiguration = ServerConfiguration(serviceType: "_vault._tcp", serviceName: "Vault")
serverConfiguration.publish = false  // listen only: the client connects by address below
serverConfiguration.channel.security = .encrypted(
    identity: serverIdentity, trust: .pinned([clientIdentity.fingerprint]))
serverConfiguration.channel.preSharedKey = key
let server = MessageServer(configuration: serverConfiguration, discovery: nil, logger: logger)
try await server.start()
// snippet.end

// snippet.client
// The client trusts servers on first use and remembers their keys, like ssh's known_hosts.
var clientConfiguration = ClientConfiguration(peerName: "tablet")
clientConfiguration.channel.security = .encrypted(
    identity: clientIdentity, trust: .trustOnFirstUse(TrustStore(path: directory + "/client/known_peers")))
clientConfiguration.channel.preSharedKey = key
let client = try await MessageClient.connect(
    to: .host("127.0.0.1", port: server.port!), configuration: clientConfiguration, logger: logger)

// What the handshake proved. On a first contact, show the code and compare it with the server's.
let proven = client.channel!.peerIdentity!
print("server '\(proven.name)' key \(proven.fingerprint), first contact: \(proven.isFirstContact)")
// snippet.end

// snippet.code
// The server sees the same six digits unless someone relays the connection.
var serverSideCode: String?
for await event in server.events {
    if case .accepted(let connection) = event {
        serverSideCode = connection.channel.peerIdentity?.comparisonCode
        break
    }
}
guard serverSideCode == proven.comparisonCode else {
    print("security: the codes differ: \(serverSideCode ?? "none") vs \(proven.comparisonCode)")
    exit(1)
}
// snippet.end
await client.close()

// snippet.impostor
// Another server under the same name, with another key: refused, never accepted silently.
var impostorConfiguration = ServerConfiguration(serviceType: "_vault._tcp", serviceName: "Vault")
impostorConfiguration.publish = false
impostorConfiguration.channel.security = .encrypted(identity: .ephemeral(), trust: .anyKey)
impostorConfiguration.channel.preSharedKey = key
let impostor = MessageServer(configuration: impostorConfiguration, discovery: nil, logger: logger)
try await impostor.start()
do {
    _ = try await MessageClient.connect(
        to: .host("127.0.0.1", port: impostor.port!), configuration: clientConfiguration, logger: logger)
    print("security: the impostor was accepted")
    exit(1)
} catch {
    print("impostor refused: \(error)")
}
// snippet.end
await impostor.stop()
await server.stop()
print("security: ok \(proven.comparisonCode)")
// snippet.hide
try? FileManager.default.removeItem(atPath: directory)
