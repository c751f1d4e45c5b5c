//! ZooKeeper metadata store. Being built.
