-- The SQL store's schema at f9d6d77 (shared/sql/schema.py then), as SQLAlchemy created it on sqlite.
-- Names: {leases}, {workers}, {state} are one application's tables (quoted identifiers).

CREATE TABLE "{leases}" (
	lease_key TEXT NOT NULL,
	lease_owner TEXT,
	lease_counter BIGINT NOT NULL,
	checkpoint TEXT,
	checkpoint_sub_sequence_number BIGINT,
	owner_switches_since_checkpoint BIGINT,
	pending_checkpoint TEXT,
	pending_checkpoint_sub_sequence_number BIGINT,
	pending_checkpoint_state BLOB,
	parent_shard_id TEXT,
	child_shard_ids TEXT,
	starting_hash_key TEXT,
	ending_hash_key TEXT,
	throughput_kbps FLOAT,
	checkpoint_owner TEXT,
	entity_type TEXT,
	stream_name TEXT,
	shard_id TEXT,
	PRIMARY KEY (lease_key)
);

CREATE TABLE "{workers}" (
	wid TEXT NOT NULL,
	lut BIGINT NOT NULL,
	sts TEXT,
	opr TEXT,
	hb BIGINT,
	worker_state TEXT,
	lease_throughput TEXT,
	lease_progress TEXT,
	drain_requested BOOLEAN,
	PRIMARY KEY (wid)
);

CREATE TABLE "{state}" (
	"key" TEXT NOT NULL,
	document TEXT NOT NULL,
	PRIMARY KEY ("key")
);

CREATE INDEX "{leases}_lease_owner_idx" ON "{leases}" (lease_owner);
