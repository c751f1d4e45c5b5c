//! `cms-broker` binary: not built yet; it says so and exits non-zero.

fn main() {
    eprintln!(
        "cms-broker: the broker (Pulsar protocol, standalone mode) is not built yet; \
         only the metadata store and `cms-bookie init-cluster` exist so far"
    );
    std::process::exit(1);
}
