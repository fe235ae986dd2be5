// What users import: `import Messaging` brings the discovery and transport types along.
@_exported import Discovery
@_exported import Transport
