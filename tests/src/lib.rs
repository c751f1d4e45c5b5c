//! `cms-tests`: the harness every CMS system test stands on. Being built.

pub mod admin_cli;
pub mod chaos;
pub mod cluster;
pub mod conformance;
pub mod docker;
pub mod faults;
pub mod harness;
pub mod history;
pub mod pulsar_py;
pub mod tls;
