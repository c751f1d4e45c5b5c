//! `cms-tests`: the harness every CMS system test stands on. Being built.
