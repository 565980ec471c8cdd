enum OpenAPISpec { static let bytes: [UInt8] = Array("openapi: 3.1.0\n".utf8) }
