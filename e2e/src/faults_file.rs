//! What the API server's and the S3 front's fault injection share: a JSON
//! settings file written atomically and read again whenever it changes,
//! a seedable generator for the draws, and a log with one JSON line per
//! fault injected.

use std::fmt::Debug;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Settings of one kind of fault injection.
pub trait FaultSettings: Serialize + DeserializeOwned + Debug {
    /// Share (0.0 to 1.0) of the matching requests that get a fault.
    fn share(&self) -> f64;
    /// How many kinds of fault are drawn from.
    fn kind_count(&self) -> usize;
    /// The seed of the draws, when the settings fix one.
    fn seed(&self) -> Option<u64>;

    /// Why these settings cannot be used, if they cannot.
    fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.share()) {
            return Err(format!("share must be within 0.0..=1.0, not {}", self.share()));
        }
        if self.kind_count() == 0 && !self.standing() {
            return Err("kinds must name at least one kind of fault".into());
        }
        Ok(())
    }

    /// Whether the settings hold a fault that is not drawn (so `kinds` may
    /// be empty): an API that is down for every request.
    fn standing(&self) -> bool {
        false
    }
}

/// `<faults_file>.log`: where the injected faults are recorded.
pub fn log_path(faults_file: &Path) -> PathBuf {
    let mut name = faults_file.as_os_str().to_os_string();
    name.push(".log");
    PathBuf::from(name)
}

/// Write `faults` to `faults_file` (replaced atomically, so a reader never
/// sees half of it), or remove the file when `None`. The log is kept.
pub(crate) fn write<T: FaultSettings>(faults_file: &Path, faults: Option<&T>) -> std::io::Result<()> {
    let Some(faults) = faults else {
        return match std::fs::remove_file(faults_file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    faults
        .check()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    if let Some(parent) = faults_file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut tmp = faults_file.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_string_pretty(faults).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, format!("{text}\n"))?;
    std::fs::rename(&tmp, faults_file)
}

/// The settings in `faults_file`: `Ok(None)` when it is absent.
pub(crate) fn read<T: FaultSettings>(faults_file: &Path) -> Result<Option<T>, String> {
    match std::fs::read_to_string(faults_file) {
        Ok(text) => {
            let faults: T = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            faults.check()?;
            Ok(Some(faults))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The faults recorded in `<faults_file>.log`, oldest first (lines that do
/// not parse are skipped; no log: none).
pub fn read_log(faults_file: &Path) -> Vec<Value> {
    std::fs::read_to_string(log_path(faults_file))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Append `line` to `log` as one write with O_APPEND, so concurrent records
/// do not interleave. `what` names the injection in a warning.
pub(crate) fn append(log: &Path, line: &Value, what: &str) {
    let mut text = line.to_string();
    text.push('\n');
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(err) = written {
        tracing::warn!(log = %log.display(), error = %err, "recording an {what} fault failed");
    }
}

/// A small, seedable generator: enough for drawing faults.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn random() -> SplitMix64 {
        let id = uuid::Uuid::new_v4();
        let b = id.as_bytes();
        SplitMix64(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Identity of one version of the faults file: a rewrite (even within the
/// same mtime tick) changes the size or, replaced by a rename, the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    mtime: Option<SystemTime>,
    len: u64,
    ino: u64,
}

/// The settings of a faults file as last read, and the draws.
pub(crate) struct Watched<T> {
    file: PathBuf,
    /// `API` or `S3`, for the log lines.
    what: &'static str,
    /// The version of the file `faults` was read from (None: no file).
    key: Option<FileKey>,
    pub(crate) faults: Option<T>,
    pub(crate) rng: SplitMix64,
}

impl<T: FaultSettings> Watched<T> {
    pub(crate) fn new(file: PathBuf, what: &'static str) -> Watched<T> {
        Watched { file, what, key: None, faults: None, rng: SplitMix64::random() }
    }

    /// Read the file again if it changed since it was last read (one
    /// `stat` when it did not); a new seed starts the draws again.
    pub(crate) fn refresh(&mut self) {
        use std::os::unix::fs::MetadataExt as _;
        let key = match std::fs::metadata(&self.file) {
            Ok(m) => Some(FileKey { mtime: m.modified().ok(), len: m.len(), ino: m.ino() }),
            Err(_) => None,
        };
        if key == self.key {
            return;
        }
        self.key = key;
        self.faults = None;
        let what = self.what;
        if key.is_none() {
            tracing::info!(file = %self.file.display(), "{what} faults off");
            return;
        }
        match read::<T>(&self.file) {
            Ok(faults) => {
                if let Some(f) = &faults {
                    if let Some(seed) = f.seed() {
                        self.rng = SplitMix64(seed);
                    }
                    tracing::info!(file = %self.file.display(), faults = ?f, "{what} faults in force");
                }
                self.faults = faults;
            }
            // once per version of the file: it is read again only when it changes
            Err(err) => tracing::warn!(
                file = %self.file.display(),
                error = %err,
                "ignoring the {what} faults file: it does not parse; no faults are injected"
            ),
        }
    }
}
