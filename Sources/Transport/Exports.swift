// The core's types are part of this module's API (until the public API is trimmed).
@_exported import ProtocolCore
