//! The latest state of every key of a snapshot, in bounded memory: what the
//! offline check needs to count live keys (per resource prefix).
//!
//! etcd's `key` bucket is ordered by revision, not by key, so whether a
//! key's latest revision is a deletion is only known once the walk is over.
//! Keeping every key's state in a table made a restore's peak RSS grow with
//! the database (92 MiB at 1 GiB, 190 MiB at 7.5 GiB of Kubernetes objects:
//! `benches/scale.rs`). Here each revision entry is appended to a buffer of
//! at most `RUN` entries; a full buffer is sorted by key digest (revision
//! order kept among equal digests), reduced to the last entry of each key,
//! and written to an anonymous scratch file under TMPDIR as a sorted run.
//! At the end the runs and the buffer are merged by digest, the entry of
//! the latest run winning. Memory: the buffer (16 bytes an entry, 16 MiB
//! at most) and 64 KiB a run; disk: 12 bytes an entry kept per run. A
//! database whose revisions fit one buffer never touches the disk.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

/// Entries per sorted run: 16 MiB of buffer.
const RUN: usize = 1 << 20;

/// One revision entry: the first 8 bytes of its key's SHA-256, its order
/// among the entries of the buffer, and its state (the key's prefix id
/// shifted left once, the low bit set when the revision is not a deletion).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    digest: u64,
    seq: u32,
    state: u32,
}

/// See the module documentation.
pub struct LatestKeys {
    buffer: Vec<Entry>,
    runs: Vec<File>,
    run: usize,
    /// The first scratch-file error: nothing is counted after it.
    error: Option<std::io::Error>,
}

impl Default for LatestKeys {
    fn default() -> Self {
        LatestKeys::with_run(RUN)
    }
}

impl LatestKeys {
    fn with_run(run: usize) -> Self {
        LatestKeys { buffer: Vec::new(), runs: Vec::new(), run: run.max(1), error: None }
    }

    /// A revision of the key whose digest is `digest`, in revision order:
    /// `prefix` its resource prefix's id, `live` false for a deletion.
    pub fn push(&mut self, digest: u64, prefix: u32, live: bool) {
        if self.error.is_some() {
            return;
        }
        let seq = self.buffer.len() as u32;
        self.buffer.push(Entry { digest, seq, state: (prefix << 1) | u32::from(live) });
        if self.buffer.len() >= self.run
            && let Err(err) = self.spill()
        {
            self.error = Some(err);
            self.buffer = Vec::new();
        }
    }

    /// Sort the buffer and keep each key's last entry.
    fn sorted_latest(&mut self) {
        self.buffer.sort_unstable();
        // sorted by (digest, seq): the last of each digest is the latest
        let mut kept = 0;
        for i in 0..self.buffer.len() {
            if i + 1 == self.buffer.len() || self.buffer[i + 1].digest != self.buffer[i].digest {
                self.buffer[kept] = self.buffer[i];
                kept += 1;
            }
        }
        self.buffer.truncate(kept);
    }

    fn spill(&mut self) -> std::io::Result<()> {
        self.sorted_latest();
        let mut file = BufWriter::with_capacity(64 << 10, tempfile::tempfile()?);
        for e in &self.buffer {
            file.write_all(&e.digest.to_le_bytes())?;
            file.write_all(&e.state.to_le_bytes())?;
        }
        let mut file = file.into_inner().map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        self.runs.push(file);
        self.buffer.clear();
        Ok(())
    }

    /// Every key's latest state, `(prefix id, live)`, to `each`; an error
    /// when a scratch file could not be written or read back (then nothing
    /// is given: a partial count would be a wrong one).
    pub fn finish(mut self, mut each: impl FnMut(u32, bool)) -> std::io::Result<()> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        self.sorted_latest();
        let memory = std::mem::take(&mut self.buffer);
        let mut sources: Vec<Source> = self.runs.into_iter().map(|f| Source::File(BufReader::with_capacity(64 << 10, f))).collect();
        // the buffer is the latest run
        sources.push(Source::Memory(memory.into_iter()));
        let mut heap = BinaryHeap::new();
        for (i, source) in sources.iter_mut().enumerate() {
            if let Some((digest, state)) = source.next()? {
                heap.push(Reverse((digest, i, state)));
            }
        }
        // each run holds a digest once, so the entry that follows a popped
        // one in its run is larger and goes back at once: the equal ones
        // still in the heap are other runs'
        let refill = |heap: &mut BinaryHeap<_>, sources: &mut [Source], i: usize| -> std::io::Result<()> {
            if let Some((d, s)) = sources[i].next()? {
                heap.push(Reverse((d, i, s)));
            }
            Ok(())
        };
        while let Some(Reverse((digest, mut run, mut state))) = heap.pop() {
            refill(&mut heap, &mut sources, run)?;
            while let Some(Reverse((next, _, _))) = heap.peek()
                && *next == digest
            {
                let Some(Reverse((_, other, other_state))) = heap.pop() else { break };
                refill(&mut heap, &mut sources, other)?;
                if other > run {
                    (run, state) = (other, other_state);
                }
            }
            each(state >> 1, state & 1 == 1);
        }
        Ok(())
    }
}

/// A sorted run being merged.
enum Source {
    File(BufReader<File>),
    Memory(std::vec::IntoIter<Entry>),
}

impl Source {
    fn next(&mut self) -> std::io::Result<Option<(u64, u32)>> {
        match self {
            Source::Memory(entries) => Ok(entries.next().map(|e| (e.digest, e.state))),
            Source::File(reader) => {
                let mut record = [0u8; 12];
                match reader.read_exact(&mut record) {
                    Ok(()) => {
                        let (digest, state) = record.split_at(8);
                        Ok(Some((
                            u64::from_le_bytes(digest.try_into().expect("8 bytes")),
                            u32::from_le_bytes(state.try_into().expect("4 bytes")),
                        )))
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
                    Err(err) => Err(err),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    /// Per prefix: live keys, counted by `keys` and by a plain table.
    fn both(run: usize, revisions: &[(u64, u32, bool)]) -> (BTreeMap<u32, u64>, BTreeMap<u32, u64>) {
        let mut keys = LatestKeys::with_run(run);
        let mut table = HashMap::new();
        for &(digest, prefix, live) in revisions {
            keys.push(digest, prefix, live);
            table.insert(digest, (prefix, live));
        }
        let mut counted = BTreeMap::new();
        keys.finish(|prefix, live| {
            if live {
                *counted.entry(prefix).or_insert(0) += 1;
            }
        })
        .expect("finish");
        let mut expected = BTreeMap::new();
        for (prefix, live) in table.into_values() {
            if live {
                *expected.entry(prefix).or_insert(0) += 1;
            }
        }
        (counted, expected)
    }

    #[test]
    fn the_latest_revision_of_each_key_wins_across_runs() {
        // key 7 created in the first run, deleted in the second, created
        // again in the buffer; key 9 deleted in a later run; key 3 only once
        let revisions = [(7, 1, true), (9, 2, true), (3, 1, true), (7, 1, false), (9, 2, true), (9, 2, false), (7, 1, true), (5, 2, true)];
        for run in [1, 2, 3, 4, 100] {
            let (counted, expected) = both(run, &revisions);
            assert_eq!(counted, expected, "run of {run}");
            assert_eq!(counted, BTreeMap::from([(1, 2), (2, 1)]), "run of {run}");
        }
    }

    #[test]
    fn many_keys_many_runs_count_as_a_table_does() {
        // a deterministic mix: 20000 revisions over 3000 keys, a fifth deletions
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let revisions: Vec<(u64, u32, bool)> = (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = x % 3000;
                (key.wrapping_mul(0x9e37_79b9_7f4a_7c15), (key % 5) as u32, x % 5 != 0)
            })
            .collect();
        for run in [1000, 4096, 1 << 20] {
            let (counted, expected) = both(run, &revisions);
            assert_eq!(counted, expected, "run of {run}");
        }
    }
}
