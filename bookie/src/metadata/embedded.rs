//! Embedded metadata store (standalone): one process, one local file. Being built.
