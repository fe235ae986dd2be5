import ProtocolCore

#if canImport(Glibc)
    import Glibc
#endif

/// A classic BPF socket filter on a listening socket that drops packets from blocked sources.
/// The kernel runs a listener's filter on the connection attempts it receives (SYN and the
/// handshake's last ACK), so a blocked source's attempts are dropped before a connection exists:
/// no accept, no wake-up, no refusal to write. A flooding host's connects then time out, as if
/// the server were unreachable to it.
///
/// An accepted socket inherits the filter it was accepted under; it only ever receives its own
/// peer's packets, which were not blocked, so there it only costs a few instructions a packet.
enum SourceFilter {
    /// Sources one filter holds at most (a jump offset is a byte: ~60 four-instruction entries).
    static let capacity = 32

    private struct Instruction {
        var code: UInt16
        var jt: UInt8 = 0
        var jf: UInt8 = 0
        var k: UInt32
    }

    // Classic BPF opcodes (linux/filter.h).
    private static let loadWordAbsolute: UInt16 = 0x20  // BPF_LD | BPF_W | BPF_ABS
    private static let jumpIfEqual: UInt16 = 0x15  // BPF_JMP | BPF_JEQ | BPF_K
    private static let returnConstant: UInt16 = 0x06  // BPF_RET | BPF_K
    /// SKF_NET_OFF: offsets from the network (IP) header.
    private static func network(_ offset: Int32) -> UInt32 { UInt32(bitPattern: -0x10_0000 + offset) }
    private static let attachFilter: Int32 = 26  // SO_ATTACH_FILTER
    private static let detachFilter: Int32 = 27  // SO_DETACH_FILTER

    /// The program dropping `sources` of `family` (IPv4 addresses; IPv6 /64 prefixes).
    private static func program(blocking sources: [HandshakeAdmission.Source], family: SocketAddress.Family) -> [Instruction] {
        var code: [Instruction] = []
        var dropJumps: [Int] = []  // instructions whose jt goes to the drop at the end
        switch family {
        case .ipv4:
            let addresses = sources.compactMap { source -> UInt32? in
                if case .ipv4(let a) = source { return UInt32(bigEndian: a) }  // BPF loads words big-endian
                return nil
            }
            guard !addresses.isEmpty else { return [] }
            code.append(Instruction(code: loadWordAbsolute, k: network(12)))  // the IPv4 source address
            for address in addresses {
                dropJumps.append(code.count)
                code.append(Instruction(code: jumpIfEqual, k: address))
            }
        case .ipv6:
            let prefixes = sources.compactMap { source -> UInt64? in
                if case .ipv6Prefix(let p) = source { return p }
                return nil
            }
            guard !prefixes.isEmpty else { return [] }
            for prefix in prefixes {
                code.append(Instruction(code: loadWordAbsolute, k: network(8)))  // the source's first 32 bits
                code.append(Instruction(code: jumpIfEqual, jt: 0, jf: 2, k: UInt32(truncatingIfNeeded: prefix >> 32)))
                code.append(Instruction(code: loadWordAbsolute, k: network(12)))  // the next 32
                dropJumps.append(code.count)
                code.append(Instruction(code: jumpIfEqual, k: UInt32(truncatingIfNeeded: prefix)))
            }
        }
        code.append(Instruction(code: returnConstant, k: UInt32.max))  // keep the packet
        let drop = code.count
        code.append(Instruction(code: returnConstant, k: 0))  // drop it
        for index in dropJumps { code[index].jt = UInt8(drop - index - 1) }
        return code
    }

    /// Installs the filter for `sources` on a listening socket (or removes it when none are of its family).
    static func apply(_ sources: [HandshakeAdmission.Source], to fd: FileDescriptor, family: SocketAddress.Family) -> Bool {
        let code = program(blocking: Array(sources.prefix(capacity)), family: family)
        guard !code.isEmpty else {
            // (the kernel wants an int-sized option even here; ENOENT when there is none: fine)
            var unused: Int32 = 0
            let result = setsockopt(fd.rawValue, SOL_SOCKET, detachFilter, &unused, socklen_t(MemoryLayout<Int32>.size))
            return result == 0 || errno == ENOENT
        }
        return code.withUnsafeBufferPointer { instructions in
            // struct sock_fprog { unsigned short len; struct sock_filter *filter; }
            withUnsafeTemporaryAllocation(byteCount: 16, alignment: 8) { program in
                program.initializeMemory(as: UInt8.self, repeating: 0)
                program.storeBytes(of: UInt16(instructions.count), toByteOffset: 0, as: UInt16.self)
                program.storeBytes(of: UnsafeRawPointer(instructions.baseAddress), toByteOffset: 8, as: UnsafeRawPointer?.self)
                return setsockopt(fd.rawValue, SOL_SOCKET, attachFilter, program.baseAddress, 16) == 0
            }
        }
    }
}
