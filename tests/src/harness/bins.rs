//! Where our built binaries are: the cargo target directory of the running test.
//!
//! Looked up in order: `$CMS_BIN_DIR/<name>`; `$NEXTEST_BIN_EXE_<name>` and
//! `$CARGO_BIN_EXE_<name>` (set for cms-tests' own binaries); the profile
//! directory of the running test binary (`target/<profile>/deps/<test>` →
//! `target/<profile>/<name>`). The binaries are not built here: the test
//! command builds them first (`cargo build --workspace --bins`).

use std::path::{Path, PathBuf};

use super::HarnessError;

/// Environment variable naming a directory that holds the binaries.
pub const BIN_DIR_ENV: &str = "CMS_BIN_DIR";

/// The target profile directory the running test binary lives in.
pub fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir.to_path_buf())
    }
}

/// The path of our binary `name`.
pub fn find(name: &str) -> Result<PathBuf, HarnessError> {
    let file = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        candidates.push(PathBuf::from(dir).join(&file));
    }
    let underscored = name.replace('-', "_");
    for var in [
        format!("NEXTEST_BIN_EXE_{name}"),
        format!("NEXTEST_BIN_EXE_{underscored}"),
        format!("CARGO_BIN_EXE_{name}"),
    ] {
        if let Some(path) = std::env::var_os(var) {
            candidates.push(PathBuf::from(path));
        }
    }
    if let Some(dir) = profile_dir() {
        candidates.push(dir.join(&file));
    }
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let tried = candidates
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(HarnessError::BinaryNotFound {
        name: name.to_string(),
        tried,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_build_command() {
        let err = find("cms-no-such-binary").unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("cargo build --workspace --bins"),
            "{message}"
        );
        assert!(message.contains("cms-no-such-binary"), "{message}");
    }

    #[test]
    fn the_profile_dir_is_above_deps() {
        let dir = profile_dir().unwrap();
        assert_ne!(dir.file_name().unwrap(), "deps");
    }
}
