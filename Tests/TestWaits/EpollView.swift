import Glibc

/// The descriptors an epoll set watches, as the kernel lists them (`/proc/self/fdinfo/<epoll>`,
/// one `tfd:` line each): what a test checks instead of watching a loop for a window of time — a
/// socket out of the set is never reported, whatever its peer does.
package func epollWatchedDescriptors(_ epoll: Int32) throws -> Set<Int32> {
    let fd = open("/proc/self/fdinfo/\(epoll)", O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw ChildWatchError(description: "cannot read /proc/self/fdinfo/\(epoll): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4_096)
    while true {
        let count = read(fd, &buffer, buffer.count)
        guard count > 0 else { break }
        bytes += buffer[0..<count]
    }
    let text = String(decoding: bytes, as: UTF8.self)
    return Set(text.split(separator: "\n").compactMap { line in
        guard line.hasPrefix("tfd:") else { return nil }
        return line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap { Int32($0) }
    })
}
