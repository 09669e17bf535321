"""The revisions, oldest first: each file changes one application's tables from its predecessor's schema."""
