"""The local cache of remote shards: its directory, streaming through a bounded cache, pinning."""
