//! `--shard i/K`: one of K parts of a fleet, for fleet backups spread over
//! the pods of an Indexed Job. A cluster belongs to the part its key's
//! SHA-256 falls in (its HostedCluster's UID for a backup, a cluster's
//! folder for a prune), so its part does not move as other clusters come
//! and go, and every part is known to every pod without talking to the
//! others.

use sha2::{Digest, Sha256};

use super::OpsError;

/// The most parts a fleet is split into.
pub const MAX_SHARDS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 0-based, below `count` (an Indexed Job's `JOB_COMPLETION_INDEX`).
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// `i/K`: part `i` (0 to K-1) of `K` (1 to 256).
    pub fn parse(text: &str) -> Result<Shard, OpsError> {
        let bad = |why: &str| OpsError::Input(format!("--shard {text}: {why}; give it as INDEX/COUNT, INDEX from 0 to COUNT-1 (as an Indexed Job's JOB_COMPLETION_INDEX), COUNT from 1 to {MAX_SHARDS}: --shard 0/4"));
        let (index, count) = text.split_once('/').ok_or_else(|| bad("no `/`"))?;
        let index: usize = index.trim().parse().map_err(|_| bad("the index is not a whole number"))?;
        let count: usize = count.trim().parse().map_err(|_| bad("the count is not a whole number"))?;
        if count == 0 || count > MAX_SHARDS {
            return Err(bad(&format!("the count must be 1 to {MAX_SHARDS}")));
        }
        if index >= count {
            return Err(bad("the index must be below the count"));
        }
        Ok(Shard { index, count })
    }

    /// The part `key` belongs to.
    pub fn of(key: &str, count: usize) -> usize {
        let digest = Sha256::digest(key.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(first) % count.max(1) as u64) as usize
    }

    /// Whether `key` is this part's.
    pub fn owns(&self, key: &str) -> bool {
        Shard::of(key, self.count) == self.index
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_parsed_and_bad_ones_say_how() {
        assert_eq!(Shard::parse("0/1").unwrap(), Shard { index: 0, count: 1 });
        assert_eq!(Shard::parse("3/4").unwrap().to_string(), "3/4");
        for bad in ["4/4", "1/0", "x/4", "1", "0/257", "-1/4"] {
            let err = Shard::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("--shard {bad}")) && err.contains("INDEX/COUNT"), "{bad}: {err}");
        }
    }

    #[test]
    fn every_key_has_exactly_one_part_that_does_not_move_as_others_come_and_go() {
        let uids: Vec<String> = (0..400).map(|i| format!("6f1c0d2e-0000-4000-8000-{i:012}")).collect();
        for count in [1, 3, 8] {
            let shards: Vec<Shard> = (0..count).map(|index| Shard { index, count }).collect();
            let mut sizes = vec![0usize; count];
            for uid in &uids {
                let owners: Vec<&Shard> = shards.iter().filter(|s| s.owns(uid)).collect();
                assert_eq!(owners.len(), 1, "{uid} in {count}: {owners:?}");
                sizes[owners[0].index] += 1;
            }
            // spread: no part has less than half its share
            assert!(sizes.iter().all(|&n| n * count * 2 >= uids.len()), "{count}: {sizes:?}");
        }
        // a key's part depends on it alone
        let before = Shard::of(&uids[7], 8);
        assert_eq!(Shard::of(&uids[7], 8), before);
    }
}
