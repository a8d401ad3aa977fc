//! Where the CRDs come from, for the sandbox and every test: the real
//! HyperShift and Cluster API CRDs named by `$HCP_DR_CRDS`, else
//! `../shared/crds` beside the repository; the sandbox falls back to the
//! project's minimal ones (`fixtures/crds`) when neither is there. Each of
//! these directories may hold a [`PLATFORM_DIR`] subdirectory with the CRDs
//! of the platforms' own controllers (assisted-service's Agent, InfraEnv and
//! NMStateConfig, metal3's BareMetalHost, ...), loaded with the others
//! ([`crd_files`]).

use std::path::{Path, PathBuf};

/// The environment variable that names the real CRD directory.
pub const CRDS_ENV: &str = "HCP_DR_CRDS";

/// The repository root (the workspace holding `e2e/`).
pub fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// The real HyperShift and Cluster API CRDs: `$HCP_DR_CRDS` when set (taken
/// as given: a wrong setting fails where it is read, it is not skipped), else
/// `../shared/crds` beside the repository when it is a directory, else None.
pub fn real_crds() -> Option<PathBuf> {
    real_crds_from().map(|(dir, _)| dir)
}

/// [`real_crds`] and where it was found.
fn real_crds_from() -> Option<(PathBuf, &'static str)> {
    if let Some(dir) = std::env::var_os(CRDS_ENV).filter(|d| !d.is_empty()) {
        return Some((PathBuf::from(dir), "from $HCP_DR_CRDS"));
    }
    let shared = repo_root().join("../shared/crds");
    shared.is_dir().then(|| {
        (
            shared.canonicalize().unwrap_or(shared),
            "the real HyperShift and Cluster API CRDs (../shared/crds)",
        )
    })
}

/// [`real_crds`] for a test that needs them: when they are absent, prints
/// `SKIP: <why>; <what> not run` and returns None (the caller returns).
pub fn real_crds_or_skip(what: &str) -> Option<PathBuf> {
    let dir = real_crds();
    if dir.is_none() {
        eprintln!(
            "SKIP: the real HyperShift and Cluster API CRDs are absent (set ${CRDS_ENV} or put them in ../shared/crds beside the repository); {what} not run"
        );
    }
    dir
}

/// The CRDs a sandbox loads and where they come from: [`real_crds`], else
/// the project's minimal ones (`fixtures/crds`).
pub fn crd_dir() -> (PathBuf, &'static str) {
    real_crds_from().unwrap_or_else(|| {
        (
            repo_root().join("fixtures/crds"),
            "the minimal fallback CRDs (fixtures/crds; ../shared/crds is absent)",
        )
    })
}

/// The subdirectory of a CRD directory holding the platform CRDs.
pub const PLATFORM_DIR: &str = "platform";

/// The CRD files of a CRD directory: its `*.yaml` files, then those of its
/// [`PLATFORM_DIR`] subdirectory when there is one, each group sorted by name.
pub fn crd_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = yaml_files(dir)?;
    let platform = dir.join(PLATFORM_DIR);
    if platform.is_dir() {
        files.extend(yaml_files(&platform)?);
    }
    Ok(files)
}

/// The `*.yaml` and `*.yml` files of `dir`, sorted by name.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    Ok(files)
}
