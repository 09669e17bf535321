"""DynamoDB backend of the lease store: KCL 3.x-compatible tables, codecs and conditional writes."""
