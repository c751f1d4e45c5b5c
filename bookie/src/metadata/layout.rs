//! The `/cms` layout (DESIGN §3) and `init-cluster`. Being built.
