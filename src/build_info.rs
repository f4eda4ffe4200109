//! Which podha build runs: its version, git commit and build date, as `build.rs` found them.
//! `podha --version` prints them and `podha_build_info` carries them as labels.

/// The crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit built (`PODHA_GIT_COMMIT`, else the work tree's HEAD, else `unknown`).
pub const GIT_COMMIT: &str = env!("PODHA_GIT_COMMIT");
/// When it was built, RFC 3339 in UTC (`SOURCE_DATE_EPOCH`, else the build's time).
pub const BUILD_DATE: &str = env!("PODHA_BUILD_DATE");
/// What `podha --version` prints after the name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PODHA_GIT_COMMIT"),
    ", built ",
    env!("PODHA_BUILD_DATE"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_version_names_version_commit_and_date() {
        assert_eq!(
            LONG_VERSION,
            format!("{VERSION} (commit {GIT_COMMIT}, built {BUILD_DATE})")
        );
        assert!(!GIT_COMMIT.is_empty());
        humantime::parse_rfc3339(BUILD_DATE).expect("an RFC 3339 build date");
    }
}
