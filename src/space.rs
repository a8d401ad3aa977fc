//! Disk space: how much a directory's file system has free, and the one
//! error hcp-dr gives when a local store or a scratch directory has not
//! enough of it, before the write (from what is known to be needed) or
//! during it (the disk filled up).

use std::path::{Path, PathBuf};

/// Not enough room in `path` for `what`.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: not enough disk space for {what}: {} needed, {} free{}; {hint}",
    path.display(),
    bytes(*needed),
    bytes(*free),
    match written { Some(w) => format!(" (the disk filled up after {} were written; the partial file was removed)", bytes(*w)), None => String::new() }
)]
pub struct NoSpace {
    pub path: PathBuf,
    pub what: String,
    /// At least this much (for a write that filled the disk: what was
    /// written so far, the least the whole needs).
    pub needed: u64,
    pub free: u64,
    /// Bytes written before the disk filled up (none when refused up front).
    pub written: Option<u64>,
    /// How to get past it.
    pub hint: String,
}

/// How to get past a scratch directory (TMPDIR) without room.
pub const SCRATCH_HINT: &str = "set TMPDIR to a directory with room for the snapshot";

/// Refuse before copying `size` bytes of `what` into a scratch file when
/// TMPDIR has not room for them.
pub fn ensure_scratch(size: u64, what: &str) -> Result<(), NoSpace> {
    ensure(&std::env::temp_dir(), size, &format!("a scratch copy of {what}"), SCRATCH_HINT)
}

/// [`filled_up`] for a scratch copy of `what` at `path`.
pub fn scratch_filled_up(err: &std::io::Error, path: &Path, what: &str, written: u64) -> Option<NoSpace> {
    filled_up(err, path, &format!("a scratch copy of {what}"), written, SCRATCH_HINT)
}

/// `n` bytes for people: `1.5 GiB`, `730 KiB`, `12 B`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// The bytes an unprivileged writer may still use on the file system that
/// holds `path` (or, when `path` does not exist yet, its nearest existing
/// ancestor, where it would be created).
pub fn free(path: &Path) -> std::io::Result<u64> {
    let absolute = std::path::absolute(path)?;
    let mut at: &Path = &absolute;
    loop {
        match rustix::fs::statvfs(at) {
            Ok(stat) => return Ok(stat.f_bavail.saturating_mul(stat.f_frsize)),
            Err(rustix::io::Errno::NOENT) => match at.parent() {
                Some(parent) => at = parent,
                None => return Err(std::io::Error::from(rustix::io::Errno::NOENT)),
            },
            Err(err) => return Err(err.into()),
        }
    }
}

/// Refuse up front when `path`'s file system has less than `needed` free.
/// A file system whose free space cannot be read is let through: the write
/// itself will say.
pub fn ensure(path: &Path, needed: u64, what: &str, hint: &str) -> Result<(), NoSpace> {
    match free(path) {
        Ok(free) if free < needed => Err(NoSpace {
            path: path.to_path_buf(),
            what: what.to_string(),
            needed,
            free,
            written: None,
            hint: hint.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Whether a write failed because the disk (or the user's quota, or the
/// file size limit) is full.
pub fn is_full(err: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(err.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge)
}

/// The [`NoSpace`] for a write into `path` that failed with `err` after
/// `written` bytes, when `err` says the disk is full.
pub fn filled_up(err: &std::io::Error, path: &Path, what: &str, written: u64, hint: &str) -> Option<NoSpace> {
    is_full(err).then(|| NoSpace {
        path: path.to_path_buf(),
        what: what.to_string(),
        needed: written,
        free: free(path).unwrap_or(0),
        written: Some(written),
        hint: hint.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(12), "12 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn a_path_not_yet_created_is_measured_where_it_would_be() {
        let dir = tempfile::tempdir().unwrap();
        let here = free(dir.path()).unwrap();
        assert!(here > 0);
        let deeper = free(&dir.path().join("a/b/c")).unwrap();
        // the same file system; other writers may change it a little in between
        assert!(deeper.abs_diff(here) < 64 << 20, "{here} vs {deeper}");
        let err = ensure(&dir.path().join("x"), u64::MAX, "a backup", "free some space").unwrap_err().to_string();
        assert!(err.contains("not enough disk space for a backup") && err.contains("free some space"), "{err}");
        assert!(ensure(dir.path(), 1, "a byte", "").is_ok());
    }

    #[test]
    fn full_disks_are_told_apart_from_other_errors() {
        assert!(is_full(&std::io::Error::from_raw_os_error(28))); // ENOSPC
        assert!(is_full(&std::io::Error::from_raw_os_error(122))); // EDQUOT
        assert!(!is_full(&std::io::Error::from_raw_os_error(13))); // EACCES
        let dir = tempfile::tempdir().unwrap();
        let err = filled_up(&std::io::Error::from_raw_os_error(28), dir.path(), "snapshot etcd-0", 4096, "choose another --to").unwrap();
        let text = err.to_string();
        assert!(text.contains("filled up after 4.0 KiB") && text.contains("choose another --to"), "{text}");
    }
}
