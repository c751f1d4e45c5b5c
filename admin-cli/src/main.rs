//! `cms-admin`, the operator CLI over the admin REST API: not built yet; it says
//! so and exits non-zero. Cluster initialisation is `cms-bookie init-cluster`.

fn main() {
    eprintln!(
        "cms-admin: the admin CLI is not built yet (the admin REST API does not exist yet); \
         to initialise a cluster use `cms-bookie init-cluster`"
    );
    std::process::exit(1);
}
