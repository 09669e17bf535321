"""The cross-backend conformance suite of the lease stores (docs/store-semantics.md)."""
