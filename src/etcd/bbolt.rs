//! A read-only, bounds-checked reader of the bbolt file format (the database
//! inside every etcd v3 snapshot), for checking a snapshot without etcd.
//!
//! The file is a sequence of fixed-size pages. Pages 0 and 1 are meta pages
//! (the valid one with the highest transaction id wins); the meta names the
//! root bucket's page and the high-water mark (`pgid`: pages in use). A
//! bucket is a B+tree of branch and leaf pages; a leaf element flagged as a
//! bucket holds a 16-byte bucket header (root page, sequence), and a root of
//! 0 means the bucket's single leaf page follows inline in the value.
//!
//! ```text
//! page header (16 bytes): id u64 | flags u16 | count u16 | overflow u32
//! meta (at 16, 64 bytes):  magic u32 | version u32 | page size u32 | flags u32 |
//!                          root bucket (root u64, sequence u64) | freelist u64 |
//!                          pgid u64 | txid u64 | checksum u64 (FNV-64a of the 56 bytes before)
//! branch element (16):     pos u32 | ksize u32 | pgid u64
//! leaf element (16):       flags u32 | pos u32 | ksize u32 | vsize u32
//! ```
//!
//! `pos` is relative to the element's own address. All integers are
//! little-endian (bbolt writes its in-memory layout, and every platform
//! OpenShift runs on is little-endian).
//!
//! The reader goes through [`Read`] + [`Seek`] one page at a time (files can
//! be many GiB) and trusts nothing: every offset is checked, every page may be
//! reached once only (a cycle or shared page is an error, not a hang), trees
//! are at most [`MAX_DEPTH`] deep, and a page may span at most
//! [`MAX_PAGE_BYTES`]. A damaged file gives a [`BoltError`], never a panic.

use std::io::{ErrorKind, Read, Seek, SeekFrom};

/// bbolt's magic number, first field of a meta page.
pub const MAGIC: u32 = 0xED0C_DAED;
/// The only data file version bbolt has.
pub const VERSION: u32 = 2;
/// Page flag: a branch page of a B+tree.
pub const BRANCH_PAGE: u16 = 0x01;
/// Page flag: a leaf page of a B+tree.
pub const LEAF_PAGE: u16 = 0x02;
/// Page flag: a meta page (pages 0 and 1).
pub const META_PAGE: u16 = 0x04;
/// Page flag: the freelist page.
pub const FREELIST_PAGE: u16 = 0x10;
/// Leaf element flag: the value is a nested bucket.
pub const BUCKET_LEAF_FLAG: u32 = 0x01;
/// Deepest tree (page levels plus bucket nesting) the reader follows; bbolt
/// trees of real databases are a handful of levels deep.
pub const MAX_DEPTH: usize = 64;
/// Largest page span (a page and its overflow pages) the reader loads. Big
/// enough for any value etcd accepts (its request limit is a few MiB).
pub const MAX_PAGE_BYTES: u64 = 256 << 20;
/// The meta's freelist page when the freelist is not written to disk (etcd
/// runs bbolt with `NoFreelistSync`).
pub const NO_FREELIST: u64 = u64::MAX;

const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const META_SIZE: usize = 64;
const META_CHECKSUM_AT: usize = 56;
const BUCKET_HEADER: usize = 16;
/// Page sizes tried for meta page 1 when meta page 0 is unreadable.
const PAGE_SIZES: [u32; 8] = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];

/// Why a bbolt file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoltError {
    /// Neither meta page is valid: this is not a bbolt database.
    #[error("{reason}")]
    NoMeta { reason: String },
    /// The structure is inconsistent (out-of-range offset, cycle, bad type...).
    #[error("{}{reason}", page.map(|p| format!("page {p}: ")).unwrap_or_default())]
    Corrupt { page: Option<u64>, reason: String },
    /// Reading the underlying file failed.
    #[error("reading at offset {offset}: {source}")]
    Io {
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

fn corrupt(page: impl Into<Option<u64>>, reason: impl Into<String>) -> BoltError {
    BoltError::Corrupt {
        page: page.into(),
        reason: reason.into(),
    }
}

/// A decoded, validated meta page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Meta {
    /// Which meta page (0 or 1) this came from.
    pub page: u64,
    pub page_size: u32,
    pub flags: u32,
    /// First page of the root bucket (whose keys are the top-level buckets).
    pub root: u64,
    /// Freelist page, or [`NO_FREELIST`].
    pub freelist: u64,
    /// High-water mark: pages 0..pgid are in use.
    pub pgid: u64,
    pub txid: u64,
}

impl Meta {
    /// Bytes of the database: pages in use times the page size (what bbolt's
    /// `Tx.Size` and `etcdctl snapshot status` call the total size).
    pub fn db_size(&self) -> u64 {
        self.pgid.saturating_mul(u64::from(self.page_size))
    }
}

/// FNV-1a, 64 bits: bbolt's meta checksum.
pub fn fnv64a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    buf.get(at..at.checked_add(2)?)?
        .try_into()
        .ok()
        .map(u16::from_le_bytes)
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at.checked_add(4)?)?
        .try_into()
        .ok()
        .map(u32::from_le_bytes)
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    buf.get(at..at.checked_add(8)?)?
        .try_into()
        .ok()
        .map(u64::from_le_bytes)
}

/// Decode and validate the meta of meta page `page` from the page's bytes
/// (header included). Checks magic, version, checksum and the page size.
pub fn parse_meta(page: u64, bytes: &[u8]) -> Result<Meta, String> {
    let meta = bytes
        .get(PAGE_HEADER..PAGE_HEADER + META_SIZE)
        .ok_or_else(|| format!("meta page {page} is cut short"))?;
    let field32 = |at| u32_at(meta, at).unwrap_or_default();
    let field64 = |at| u64_at(meta, at).unwrap_or_default();
    let magic = field32(0);
    if magic != MAGIC {
        return Err(format!(
            "meta page {page} has magic {magic:#010x}, not bbolt's {MAGIC:#010x}"
        ));
    }
    let version = field32(4);
    if version != VERSION {
        return Err(format!(
            "meta page {page} has data file version {version}, not {VERSION}"
        ));
    }
    let checksum = field64(META_CHECKSUM_AT);
    let sum = fnv64a(&meta[..META_CHECKSUM_AT]);
    // bbolt accepts a zero checksum (files from before checksums existed).
    if checksum != 0 && checksum != sum {
        return Err(format!(
            "meta page {page} checksum {checksum:#018x} does not match its content ({sum:#018x})"
        ));
    }
    let page_size = field32(8);
    if !page_size.is_power_of_two() || !(512..=1 << 20).contains(&page_size) {
        return Err(format!(
            "meta page {page} has an impossible page size {page_size}"
        ));
    }
    Ok(Meta {
        page,
        page_size,
        flags: field32(12),
        root: field64(16),
        freelist: field64(32),
        pgid: field64(40),
        txid: field64(48),
    })
}

/// Receives the top-level buckets and their entries, in bbolt's order (the
/// order of `Cursor.Next`/`Bucket.ForEach`).
pub trait Visitor {
    /// A top-level bucket starts.
    fn bucket(&mut self, name: &[u8]);
    /// An entry of the current top-level bucket; `None` for a nested bucket
    /// (bbolt's `ForEach` gives a nil value for those).
    fn entry(&mut self, key: &[u8], value: Option<&[u8]>);
}

/// What a walk saw, besides what went to the visitor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WalkStats {
    pub branch_pages: u64,
    pub leaf_pages: u64,
    pub overflow_pages: u64,
    /// Pages on the freelist, when the freelist is stored in the file.
    pub free_pages: Option<u64>,
}

/// No etcd database is larger: etcd's quota tops out far below (8 GiB
/// recommended). A meta page claiming more is damage, refused before any
/// per-page structure is sized by it.
const MAX_DB_BYTES: u64 = 1 << 40;

/// A page set sized by the high-water mark.
struct PageSet(Vec<u64>);

impl PageSet {
    fn new(pages: u64) -> PageSet {
        PageSet(vec![0; usize::try_from(pages.div_ceil(64)).unwrap_or(0)])
    }

    /// Mark `page`; false when it was already marked or is out of range.
    fn insert(&mut self, page: u64) -> bool {
        let Some(word) = usize::try_from(page / 64)
            .ok()
            .and_then(|w| self.0.get_mut(w))
        else {
            return false;
        };
        let bit = 1u64 << (page % 64);
        let fresh = *word & bit == 0;
        *word |= bit;
        fresh
    }

    fn contains(&self, page: u64) -> bool {
        usize::try_from(page / 64)
            .ok()
            .and_then(|w| self.0.get(w))
            .is_some_and(|word| word & (1u64 << (page % 64)) != 0)
    }
}

/// Where a bucket's tree starts.
enum BucketRoot<'a> {
    Page(u64),
    /// The bucket's only (leaf) page, stored in its parent's value.
    Inline(&'a [u8]),
}

fn bucket_root(value: &[u8]) -> Result<BucketRoot<'_>, String> {
    let root = u64_at(value, 0)
        .filter(|_| value.len() >= BUCKET_HEADER)
        .ok_or_else(|| {
            format!(
                "a bucket value of {} bytes is shorter than a bucket header",
                value.len()
            )
        })?;
    if root != 0 {
        return Ok(BucketRoot::Page(root));
    }
    let inline = &value[BUCKET_HEADER..];
    if inline.len() < PAGE_HEADER {
        return Err(format!(
            "an inline bucket of {} bytes has no page header",
            inline.len()
        ));
    }
    Ok(BucketRoot::Inline(inline))
}

/// Element `index` of a leaf page: (flags, key, value).
fn leaf_element(page: &[u8], index: usize) -> Result<(u32, &[u8], &[u8]), String> {
    let at = PAGE_HEADER + index * ELEMENT;
    let field = |offset| {
        u32_at(page, at + offset)
            .ok_or_else(|| format!("leaf element {index} lies past the page end"))
    };
    let (flags, pos, ksize, vsize) = (field(0)?, field(4)?, field(8)?, field(12)?);
    let key_start = at as u64 + u64::from(pos);
    let key_end = key_start + u64::from(ksize);
    let value_end = key_end + u64::from(vsize);
    if value_end > page.len() as u64 {
        return Err(format!(
            "leaf element {index}: key and value end at byte {value_end}, past the page's {} bytes",
            page.len()
        ));
    }
    // All three fit in the page, hence in usize.
    let (key_start, key_end, value_end) =
        (key_start as usize, key_end as usize, value_end as usize);
    Ok((flags, &page[key_start..key_end], &page[key_end..value_end]))
}

/// Element `index` of a branch page: the child page id.
fn branch_child(page: &[u8], index: usize) -> Result<u64, String> {
    let at = PAGE_HEADER + index * ELEMENT;
    let (pos, ksize, child) = match (u32_at(page, at), u32_at(page, at + 4), u64_at(page, at + 8)) {
        (Some(pos), Some(ksize), Some(child)) => (pos, ksize, child),
        _ => return Err(format!("branch element {index} lies past the page end")),
    };
    let key_end = at as u64 + u64::from(pos) + u64::from(ksize);
    if key_end > page.len() as u64 {
        return Err(format!(
            "branch element {index}: key ends at byte {key_end}, past the page's {} bytes",
            page.len()
        ));
    }
    Ok(child)
}

/// The header of a page held in `bytes`: (flags, count, overflow).
fn header(bytes: &[u8]) -> (u16, u16, u32) {
    (
        u16_at(bytes, 8).unwrap_or_default(),
        u16_at(bytes, 10).unwrap_or_default(),
        u32_at(bytes, 12).unwrap_or_default(),
    )
}

fn page_kind(flags: u16) -> String {
    match flags {
        BRANCH_PAGE => "branch".into(),
        LEAF_PAGE => "leaf".into(),
        META_PAGE => "meta".into(),
        FREELIST_PAGE => "freelist".into(),
        other => format!("unknown ({other:#06x})"),
    }
}

/// Called for each leaf element of a bucket: (database, key, flags, value).
type EntryFn<'f, R> = dyn FnMut(&mut Db<R>, &[u8], u32, &[u8]) -> Result<(), BoltError> + 'f;

/// An open bbolt file.
pub struct Db<R> {
    reader: R,
    /// Bytes available to read (the file length, or less when the caller
    /// knows the tail is not database).
    len: u64,
    meta: Meta,
    seen: PageSet,
    stats: WalkStats,
}

impl<R: Read + Seek> Db<R> {
    /// Read both meta pages of a file of `len` bytes and keep the valid one
    /// with the highest transaction id.
    pub fn open(mut reader: R, len: u64) -> Result<Db<R>, BoltError> {
        let meta = read_meta(&mut reader, len)?;
        Ok(Db {
            reader,
            len,
            meta,
            seen: PageSet::new(0),
            stats: WalkStats::default(),
        })
    }

    /// The meta page in use.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Walk every bucket (nested ones included, for their structure) and give
    /// the top-level buckets' entries to `visitor`. Checks that each page in
    /// use is reached exactly once, that keys are in order, and, when the
    /// freelist is stored, that every page is either in use or free.
    pub fn walk(&mut self, visitor: &mut dyn Visitor) -> Result<WalkStats, BoltError> {
        let meta = self.meta;
        if meta.db_size() > self.len {
            return Err(corrupt(
                None,
                format!(
                    "the meta says {} pages of {} bytes ({} bytes) but only {} bytes are present",
                    meta.pgid,
                    meta.page_size,
                    meta.db_size(),
                    self.len
                ),
            ));
        }
        if meta.pgid < 3 {
            return Err(corrupt(
                None,
                format!("the meta says only {} pages are in use", meta.pgid),
            ));
        }
        if meta.db_size() > MAX_DB_BYTES {
            return Err(corrupt(
                None,
                format!(
                    "the meta says {} pages of {} bytes ({} bytes): larger than any etcd database (etcd refuses writes past its quota, 8 GiB at most recommended)",
                    meta.pgid,
                    meta.page_size,
                    meta.db_size()
                ),
            ));
        }
        // the last page in use must be there before pages are counted
        let mut last = [0u8; 1];
        self.read_at(meta.db_size() - 1, &mut last).map_err(|_| {
            corrupt(
                None,
                format!("the meta says {} pages of {} bytes ({} bytes) but the data ends before that", meta.pgid, meta.page_size, meta.db_size()),
            )
        })?;
        self.seen = PageSet::new(meta.pgid);
        self.stats = WalkStats::default();
        self.seen.insert(0);
        self.seen.insert(1);

        self.bucket_entries(
            b"(root)",
            BucketRoot::Page(meta.root),
            0,
            &mut |db, name, flags, value| {
                if flags & BUCKET_LEAF_FLAG == 0 {
                    return Err(corrupt(
                        None,
                        format!(
                            "the root bucket holds `{}`, which is not a bucket",
                            String::from_utf8_lossy(name)
                        ),
                    ));
                }
                let root = bucket_root(value).map_err(|reason| bucket_error(name, reason))?;
                visitor.bucket(name);
                db.bucket_entries(name, root, 1, &mut |db, key, flags, value| {
                    if flags & BUCKET_LEAF_FLAG != 0 {
                        visitor.entry(key, None);
                        let nested =
                            bucket_root(value).map_err(|reason| bucket_error(key, reason))?;
                        db.check_nested(key, nested, 2)
                    } else {
                        visitor.entry(key, Some(value));
                        Ok(())
                    }
                })
            },
        )?;
        if meta.freelist != NO_FREELIST {
            self.check_freelist()?;
        }
        Ok(self.stats)
    }

    /// Walk a nested bucket for its structure only.
    fn check_nested(
        &mut self,
        name: &[u8],
        root: BucketRoot<'_>,
        depth: usize,
    ) -> Result<(), BoltError> {
        self.bucket_entries(name, root, depth, &mut |db, key, flags, value| {
            if flags & BUCKET_LEAF_FLAG == 0 {
                return Ok(());
            }
            let nested = bucket_root(value).map_err(|reason| bucket_error(key, reason))?;
            db.check_nested(key, nested, depth + 1)
        })
    }

    /// Every entry of one bucket, in order, with the order checked.
    fn bucket_entries(
        &mut self,
        name: &[u8],
        root: BucketRoot<'_>,
        depth: usize,
        each: &mut EntryFn<'_, R>,
    ) -> Result<(), BoltError> {
        let mut previous: Option<Vec<u8>> = None;
        let mut ordered = |db: &mut Db<R>, key: &[u8], flags: u32, value: &[u8]| {
            match &mut previous {
                Some(prev) if key <= prev.as_slice() => {
                    return Err(bucket_error(
                        name,
                        "keys are out of order (or repeated)".into(),
                    ));
                }
                Some(prev) => {
                    prev.clear();
                    prev.extend_from_slice(key);
                }
                None => previous = Some(key.to_vec()),
            }
            each(db, key, flags, value)
        };
        match root {
            BucketRoot::Page(page) => self.walk_page(page, depth, &mut ordered),
            BucketRoot::Inline(bytes) => {
                let (flags, count, _) = header(bytes);
                if flags != LEAF_PAGE {
                    return Err(bucket_error(
                        name,
                        format!("its inline page is a {} page, not a leaf", page_kind(flags)),
                    ));
                }
                self.stats.leaf_pages += 1;
                self.leaf_entries(None, bytes, count, &mut ordered)
            }
        }
    }

    fn leaf_entries(
        &mut self,
        page: Option<u64>,
        bytes: &[u8],
        count: u16,
        each: &mut EntryFn<'_, R>,
    ) -> Result<(), BoltError> {
        for index in 0..usize::from(count) {
            let (flags, key, value) =
                leaf_element(bytes, index).map_err(|reason| corrupt(page, reason))?;
            each(self, key, flags, value)?;
        }
        Ok(())
    }

    fn walk_page(
        &mut self,
        page: u64,
        depth: usize,
        each: &mut EntryFn<'_, R>,
    ) -> Result<(), BoltError> {
        if depth > MAX_DEPTH {
            return Err(corrupt(
                page,
                format!("the tree is more than {MAX_DEPTH} levels deep"),
            ));
        }
        let bytes = self.read_page(page)?;
        let (flags, count, _) = header(&bytes);
        match flags {
            BRANCH_PAGE => {
                if count == 0 {
                    return Err(corrupt(page, "a branch page with no elements"));
                }
                self.stats.branch_pages += 1;
                for index in 0..usize::from(count) {
                    let child =
                        branch_child(&bytes, index).map_err(|reason| corrupt(page, reason))?;
                    self.walk_page(child, depth + 1, each)?;
                }
                Ok(())
            }
            LEAF_PAGE => {
                self.stats.leaf_pages += 1;
                self.leaf_entries(Some(page), &bytes, count, each)
            }
            other => Err(corrupt(
                page,
                format!("a bucket's tree leads to a {} page", page_kind(other)),
            )),
        }
    }

    /// Read page `page` and its overflow pages, marking them reached.
    fn read_page(&mut self, page: u64) -> Result<Vec<u8>, BoltError> {
        let meta = self.meta;
        if page < 2 {
            return Err(corrupt(page, "a bucket's tree points to a meta page"));
        }
        if page >= meta.pgid {
            return Err(corrupt(
                page,
                format!("beyond the high-water mark ({} pages in use)", meta.pgid),
            ));
        }
        let page_size = u64::from(meta.page_size);
        // page < pgid, and pgid * page_size <= len (checked in walk): no overflow.
        let offset = page * page_size;
        let mut head = [0u8; PAGE_HEADER];
        self.read_at(offset, &mut head)?;
        let id = u64_at(&head, 0).unwrap_or_default();
        if id != page {
            return Err(corrupt(page, format!("its header says it is page {id}")));
        }
        let (_, _, overflow) = header(&head);
        let last = page + u64::from(overflow);
        if last >= meta.pgid {
            return Err(corrupt(
                page,
                format!(
                    "{overflow} overflow pages run past the high-water mark ({} pages in use)",
                    meta.pgid
                ),
            ));
        }
        let span = (u64::from(overflow) + 1) * page_size;
        if span > MAX_PAGE_BYTES {
            return Err(corrupt(
                page,
                format!("spans {span} bytes, more than the {MAX_PAGE_BYTES} this reader accepts"),
            ));
        }
        for p in page..=last {
            if !self.seen.insert(p) {
                return Err(corrupt(
                    p,
                    "reached twice (a cycle, or pages shared between trees)",
                ));
            }
        }
        self.stats.overflow_pages += u64::from(overflow);
        // span <= MAX_PAGE_BYTES, so it fits in usize.
        let mut bytes = vec![0u8; span as usize];
        self.read_at(offset, &mut bytes)?;
        Ok(bytes)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), BoltError> {
        read_exact_at(&mut self.reader, self.len, offset, buf)
    }

    /// bbolt's `Tx.Check` accounting: the freelist page is in use, no free
    /// page is reachable or freed twice, and every page is used or free.
    fn check_freelist(&mut self) -> Result<(), BoltError> {
        let page = self.meta.freelist;
        if page < 2 || page >= self.meta.pgid {
            return Err(corrupt(
                None,
                format!(
                    "the freelist page {page} is outside the {} pages in use",
                    self.meta.pgid
                ),
            ));
        }
        let bytes = self.read_page(page)?;
        let (flags, count, _) = header(&bytes);
        if flags != FREELIST_PAGE {
            return Err(corrupt(
                page,
                format!("the freelist is a {} page", page_kind(flags)),
            ));
        }
        let (first, count) = if count == 0xFFFF {
            let real = u64_at(&bytes, PAGE_HEADER)
                .ok_or_else(|| corrupt(page, "freelist count cut short"))?;
            (PAGE_HEADER + 8, real)
        } else {
            (PAGE_HEADER, u64::from(count))
        };
        let room = ((bytes.len() - first) / 8) as u64;
        if count > room {
            return Err(corrupt(
                page,
                format!("the freelist claims {count} ids but has room for {room}"),
            ));
        }
        let mut free = PageSet::new(self.meta.pgid);
        for index in 0..count as usize {
            let id = u64_at(&bytes, first + index * 8).unwrap_or_default();
            if id < 2 || id >= self.meta.pgid {
                return Err(corrupt(id, "on the freelist but outside the pages in use"));
            }
            if self.seen.contains(id) {
                return Err(corrupt(id, "reachable and on the freelist"));
            }
            if !free.insert(id) {
                return Err(corrupt(id, "on the freelist twice"));
            }
        }
        if let Some(unaccounted) =
            (0..self.meta.pgid).find(|p| !self.seen.contains(*p) && !free.contains(*p))
        {
            return Err(corrupt(unaccounted, "neither reachable nor free"));
        }
        self.stats.free_pages = Some(count);
        Ok(())
    }
}

fn bucket_error(name: &[u8], reason: String) -> BoltError {
    corrupt(
        None,
        format!("bucket `{}`: {reason}", String::from_utf8_lossy(name)),
    )
}

/// Fill `buf` from `offset`; running past `len` or the file's end is corruption.
fn read_exact_at<R: Read + Seek>(
    reader: &mut R,
    len: u64,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), BoltError> {
    let end = offset.checked_add(buf.len() as u64);
    if end.is_none_or(|end| end > len) {
        return Err(corrupt(
            None,
            format!(
                "{} bytes at offset {offset} lie past the end of the data ({len} bytes)",
                buf.len()
            ),
        ));
    }
    let io = |source| BoltError::Io { offset, source };
    reader.seek(SeekFrom::Start(offset)).map_err(io)?;
    reader.read_exact(buf).map_err(|source| {
        if source.kind() == ErrorKind::UnexpectedEof {
            corrupt(
                None,
                format!(
                    "the file ends inside the {} bytes at offset {offset}",
                    buf.len()
                ),
            )
        } else {
            io(source)
        }
    })
}

/// Find the meta page to use: meta 0 gives the page size when valid, else
/// meta 1 is looked for at each common page size.
pub fn read_meta<R: Read + Seek>(reader: &mut R, len: u64) -> Result<Meta, BoltError> {
    const NEED: usize = PAGE_HEADER + META_SIZE;
    if len < NEED as u64 {
        return Err(BoltError::NoMeta {
            reason: if len == 0 {
                "the file is empty".into()
            } else {
                format!("{len} bytes is too short to hold a bbolt meta page")
            },
        });
    }
    let mut buf = [0u8; NEED];
    read_exact_at(reader, len, 0, &mut buf)?;
    let mut candidates = Vec::new();
    let mut reasons = Vec::new();
    // Meta 1 is at one page size from the start: the one meta 0 gives, or
    // (meta 0 being damaged) each common size in turn.
    let (sizes, probing) = match parse_meta(0, &buf) {
        Ok(meta) => {
            candidates.push(meta);
            (vec![meta.page_size], false)
        }
        Err(reason) => {
            reasons.push(reason);
            (PAGE_SIZES.to_vec(), true)
        }
    };
    for size in sizes {
        let offset = u64::from(size);
        if offset + NEED as u64 > len {
            break;
        }
        read_exact_at(reader, len, offset, &mut buf)?;
        match parse_meta(1, &buf) {
            Ok(meta) if meta.page_size == size => {
                candidates.push(meta);
                break;
            }
            Ok(_) | Err(_) if probing => {}
            Ok(meta) => reasons.push(format!(
                "meta page 1 says the page size is {}",
                meta.page_size
            )),
            Err(reason) => reasons.push(reason),
        }
    }
    if probing && candidates.is_empty() {
        reasons.push("no valid meta page 1 at any common page size".into());
    }
    candidates
        .into_iter()
        .max_by_key(|meta| meta.txid)
        .ok_or_else(|| BoltError::NoMeta {
            reason: format!("no valid bbolt meta page: {}", reasons.join("; ")),
        })
}

#[cfg(test)]
pub(crate) mod testdb {
    //! Hand-built bbolt files for tests.

    use super::*;

    pub const PAGE: usize = 4096;

    /// A page with a header.
    pub fn page(id: u64, flags: u16, count: u16, overflow: u32, size: usize) -> Vec<u8> {
        let mut p = vec![0u8; size];
        p[0..8].copy_from_slice(&id.to_le_bytes());
        p[8..10].copy_from_slice(&flags.to_le_bytes());
        p[10..12].copy_from_slice(&count.to_le_bytes());
        p[12..16].copy_from_slice(&overflow.to_le_bytes());
        p
    }

    pub fn meta_page(id: u64, root: u64, pgid: u64, txid: u64, freelist: u64) -> Vec<u8> {
        let mut p = page(id, META_PAGE, 0, 0, PAGE);
        let m = &mut p[PAGE_HEADER..PAGE_HEADER + META_SIZE];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4..8].copy_from_slice(&VERSION.to_le_bytes());
        m[8..12].copy_from_slice(&(PAGE as u32).to_le_bytes());
        m[16..24].copy_from_slice(&root.to_le_bytes());
        m[32..40].copy_from_slice(&freelist.to_le_bytes());
        m[40..48].copy_from_slice(&pgid.to_le_bytes());
        m[48..56].copy_from_slice(&txid.to_le_bytes());
        let sum = fnv64a(&m[..META_CHECKSUM_AT]);
        m[56..64].copy_from_slice(&sum.to_le_bytes());
        p
    }

    /// A leaf page (`id` 0 for an inline page) holding (flags, key, value).
    pub fn leaf(id: u64, entries: &[(u32, &[u8], &[u8])], size: usize) -> Vec<u8> {
        let body: usize = entries.iter().map(|(_, k, v)| k.len() + v.len()).sum();
        let needed = PAGE_HEADER + entries.len() * ELEMENT + body;
        // size 0: an inline page, exactly as long as its content
        let pages = needed.checked_div(size).map(|_| needed.div_ceil(size));
        let span = pages.map_or(needed, |n| n * size);
        let overflow = pages.map_or(0, |n| (n - 1) as u32);
        let mut p = page(id, LEAF_PAGE, entries.len() as u16, overflow, span);
        let mut data = PAGE_HEADER + entries.len() * ELEMENT;
        for (i, (flags, key, value)) in entries.iter().enumerate() {
            let at = PAGE_HEADER + i * ELEMENT;
            p[at..at + 4].copy_from_slice(&flags.to_le_bytes());
            p[at + 4..at + 8].copy_from_slice(&((data - at) as u32).to_le_bytes());
            p[at + 8..at + 12].copy_from_slice(&(key.len() as u32).to_le_bytes());
            p[at + 12..at + 16].copy_from_slice(&(value.len() as u32).to_le_bytes());
            p[data..data + key.len()].copy_from_slice(key);
            data += key.len();
            p[data..data + value.len()].copy_from_slice(value);
            data += value.len();
        }
        p
    }

    pub fn branch(id: u64, children: &[(&[u8], u64)]) -> Vec<u8> {
        let mut p = page(id, BRANCH_PAGE, children.len() as u16, 0, PAGE);
        let mut data = PAGE_HEADER + children.len() * ELEMENT;
        for (i, (key, child)) in children.iter().enumerate() {
            let at = PAGE_HEADER + i * ELEMENT;
            p[at..at + 4].copy_from_slice(&((data - at) as u32).to_le_bytes());
            p[at + 4..at + 8].copy_from_slice(&(key.len() as u32).to_le_bytes());
            p[at + 8..at + 16].copy_from_slice(&child.to_le_bytes());
            p[data..data + key.len()].copy_from_slice(key);
            data += key.len();
        }
        p
    }

    /// A bucket value pointing at page `root`.
    pub fn bucket_at(root: u64) -> Vec<u8> {
        let mut v = root.to_le_bytes().to_vec();
        v.extend_from_slice(&[0u8; 8]);
        v
    }

    /// An inline bucket value holding `entries`.
    pub fn inline_bucket(entries: &[(u32, &[u8], &[u8])]) -> Vec<u8> {
        let mut v = bucket_at(0);
        v.extend_from_slice(&leaf(0, entries, 0));
        v
    }

    pub fn revision_key(main: u64, sub: u64, tombstone: bool) -> Vec<u8> {
        let mut k = main.to_be_bytes().to_vec();
        k.push(b'_');
        k.extend_from_slice(&sub.to_be_bytes());
        if tombstone {
            k.push(b't');
        }
        k
    }

    /// mvccpb.KeyValue with key, create/mod revision, version and value.
    pub fn key_value(key: &[u8], revision: u64, value: &[u8]) -> Vec<u8> {
        fn varint(out: &mut Vec<u8>, mut n: u64) {
            while n >= 0x80 {
                out.push((n as u8) | 0x80);
                n >>= 7;
            }
            out.push(n as u8);
        }
        let mut out = vec![0x0a];
        varint(&mut out, key.len() as u64);
        out.extend_from_slice(key);
        for field in [0x10u8, 0x18, 0x20] {
            out.push(field);
            varint(&mut out, revision);
        }
        if !value.is_empty() {
            out.push(0x2a);
            varint(&mut out, value.len() as u64);
            out.extend_from_slice(value);
        }
        out
    }

    /// A small etcd-like database: root (page 2) holds `key` (a branch at
    /// page 3 over leaves 4 and 5, the second with an overflow page) and an
    /// inline `meta` bucket. Revisions 2..=7: five puts (`/a/x/1`..`/a/x/3`,
    /// `/b/y/1`, `/a/x/2` again) and a tombstone of `/a/x/1`. Pages 0..=6.
    pub fn etcd_like() -> Vec<u8> {
        let kv = |rev: u64, key: &str, value: &[u8]| {
            (
                revision_key(rev, 0, false),
                key_value(key.as_bytes(), rev, value),
            )
        };
        let r2 = kv(2, "/a/x/1", b"one");
        let r3 = kv(3, "/a/x/2", b"two");
        let r4 = kv(4, "/a/x/3", b"three");
        let r5 = kv(5, "/b/y/1", &[7u8; 5000]);
        let r6 = kv(6, "/a/x/2", b"two again");
        let r7 = (revision_key(7, 0, true), key_value(b"/a/x/1", 7, b""));
        let leaf4 = leaf(
            4,
            &[(0, &r2.0, &r2.1), (0, &r3.0, &r3.1), (0, &r4.0, &r4.1)],
            PAGE,
        );
        let leaf5 = leaf(
            5,
            &[(0, &r5.0, &r5.1), (0, &r6.0, &r6.1), (0, &r7.0, &r7.1)],
            PAGE,
        );
        assert_eq!(leaf5.len(), 2 * PAGE, "leaf 5 has one overflow page");
        let branch3 = branch(3, &[(&r2.0, 4), (&r5.0, 5)]);
        let meta_bucket = inline_bucket(&[
            (0, b"consistent_index", &42u64.to_be_bytes()),
            (0, b"finishedCompactRev", &revision_key(3, 0, false)),
        ]);
        let root = leaf(
            2,
            &[
                (BUCKET_LEAF_FLAG, b"key", &bucket_at(3)),
                (BUCKET_LEAF_FLAG, b"meta", &meta_bucket),
            ],
            PAGE,
        );
        let mut db = meta_page(0, 2, 7, 10, NO_FREELIST);
        db.extend(meta_page(1, 2, 7, 9, NO_FREELIST));
        db.extend(root);
        db.extend(branch3);
        db.extend(leaf4);
        db.extend(leaf5);
        db
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::testdb::*;
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<(String, Vec<u8>, Option<Vec<u8>>)>);

    impl Visitor for Collect {
        fn bucket(&mut self, name: &[u8]) {
            self.0
                .push((String::from_utf8_lossy(name).into(), Vec::new(), None));
        }
        fn entry(&mut self, key: &[u8], value: Option<&[u8]>) {
            let bucket = self.0.last().map(|e| e.0.clone()).unwrap_or_default();
            self.0
                .push((bucket, key.to_vec(), value.map(<[u8]>::to_vec)));
        }
    }

    fn walk(bytes: &[u8]) -> Result<(WalkStats, Collect), BoltError> {
        let mut db = Db::open(Cursor::new(bytes), bytes.len() as u64)?;
        let mut seen = Collect::default();
        let stats = db.walk(&mut seen)?;
        Ok((stats, seen))
    }

    #[test]
    fn fnv64a_vectors() {
        assert_eq!(fnv64a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv64a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv64a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn reads_a_hand_built_database() {
        let db = etcd_like();
        let (stats, seen) = walk(&db).unwrap();
        assert_eq!(
            stats,
            WalkStats {
                branch_pages: 1,
                leaf_pages: 4,
                overflow_pages: 1,
                free_pages: None
            }
        );
        let buckets: Vec<_> = seen
            .0
            .iter()
            .filter(|e| e.1.is_empty())
            .map(|e| e.0.as_str())
            .collect();
        assert_eq!(buckets, ["key", "meta"]);
        let keys: Vec<_> = seen
            .0
            .iter()
            .filter(|e| e.0 == "key" && !e.1.is_empty())
            .collect();
        assert_eq!(keys.len(), 6);
        assert_eq!(keys[5].1, revision_key(7, 0, true));
        let meta: Vec<_> = seen
            .0
            .iter()
            .filter(|e| e.0 == "meta" && !e.1.is_empty())
            .collect();
        assert_eq!(meta[0].1, b"consistent_index");
        assert_eq!(meta[0].2.as_deref(), Some(&42u64.to_be_bytes()[..]));
    }

    #[test]
    fn picks_the_valid_meta_with_the_highest_txid() {
        let mut db = etcd_like();
        assert_eq!(
            read_meta(&mut Cursor::new(&db), db.len() as u64)
                .unwrap()
                .txid,
            10
        );
        // meta 0 damaged: meta 1 (txid 9) is used, found at the 4096 offset
        db[PAGE_HEADER + 20] ^= 0xff;
        let meta = read_meta(&mut Cursor::new(&db), db.len() as u64).unwrap();
        assert_eq!((meta.page, meta.txid, meta.page_size), (1, 9, 4096));
        // both damaged
        db[PAGE + PAGE_HEADER + 20] ^= 0xff;
        let err = read_meta(&mut Cursor::new(&db), db.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(err.contains("checksum"), "{err}");
        // wrong magic
        let mut other = etcd_like();
        other[PAGE_HEADER] = 0;
        other[PAGE + PAGE_HEADER] = 0;
        let err = read_meta(&mut Cursor::new(&other), other.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(err.contains("magic"), "{err}");
        assert!(
            read_meta(&mut Cursor::new(&[] as &[u8]), 0)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }

    /// Replace page `id` of the database.
    fn with_page(mut db: Vec<u8>, id: usize, page: &[u8]) -> Vec<u8> {
        db[id * PAGE..id * PAGE + page.len()].copy_from_slice(page);
        db
    }

    fn assert_corrupt(db: &[u8], needle: &str) {
        match walk(db) {
            Err(BoltError::Corrupt { page, reason }) => {
                let text = BoltError::Corrupt { page, reason }.to_string();
                assert!(text.contains(needle), "expected `{needle}` in `{text}`");
            }
            Err(other) => panic!("expected corruption `{needle}`, got {other}"),
            Ok(_) => panic!("expected corruption `{needle}`, the walk succeeded"),
        }
    }

    #[test]
    fn malformed_pages_are_errors() {
        let good = etcd_like();
        // a branch pointing at itself
        assert_corrupt(
            &with_page(good.clone(), 3, &branch(3, &[(b"a", 3)])),
            "reached twice",
        );
        // two branch children sharing a leaf
        assert_corrupt(
            &with_page(good.clone(), 3, &branch(3, &[(b"a", 4), (b"b", 4)])),
            "page 4: reached twice",
        );
        // a child beyond the high-water mark, and one pointing at a meta page
        assert_corrupt(
            &with_page(good.clone(), 3, &branch(3, &[(b"a", 99)])),
            "beyond the high-water mark",
        );
        assert_corrupt(
            &with_page(good.clone(), 3, &branch(3, &[(b"a", 1)])),
            "meta page",
        );
        // a page whose header names another page
        assert_corrupt(
            &with_page(good.clone(), 3, &branch(4, &[(b"a", 4)])),
            "header says it is page 4",
        );
        // a huge element count: the zeroed elements after the real one point at page 0
        let mut p = branch(3, &[(b"a", 4)]);
        p[10..12].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_corrupt(
            &with_page(good.clone(), 3, &p),
            "page 0: a bucket's tree points to a meta page",
        );
        // a key position far outside the page
        let mut p = leaf(4, &[(0, b"k", b"v")], PAGE);
        p[PAGE_HEADER + 4..PAGE_HEADER + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_corrupt(
            &with_page(good.clone(), 4, &p),
            "past the page's 4096 bytes",
        );
        // a value size far outside the page
        let mut p = leaf(4, &[(0, b"k", b"v")], PAGE);
        p[PAGE_HEADER + 12..PAGE_HEADER + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_corrupt(&with_page(good.clone(), 4, &p), "past the page's");
        // overflow beyond the file
        let mut p = branch(3, &[(b"a", 4)]);
        p[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_corrupt(&with_page(good.clone(), 3, &p), "overflow pages run past");
        // a freelist page inside a tree
        assert_corrupt(
            &with_page(good.clone(), 4, &page(4, FREELIST_PAGE, 0, 0, PAGE)),
            "leads to a freelist page",
        );
        // keys out of order in a leaf
        assert_corrupt(
            &with_page(
                good.clone(),
                4,
                &leaf(4, &[(0, b"b", b""), (0, b"a", b"")], PAGE),
            ),
            "out of order",
        );
        // a non-bucket in the root
        assert_corrupt(
            &with_page(good.clone(), 2, &leaf(2, &[(0, b"key", b"x")], PAGE)),
            "not a bucket",
        );
        // a bucket value too short for a header
        assert_corrupt(
            &with_page(
                good.clone(),
                2,
                &leaf(2, &[(BUCKET_LEAF_FLAG, b"key", b"x")], PAGE),
            ),
            "shorter than a bucket header",
        );
        // an inline bucket that claims more elements than it holds
        let mut inline = inline_bucket(&[(0, b"k", b"v")]);
        inline[BUCKET_HEADER + 10..BUCKET_HEADER + 12].copy_from_slice(&500u16.to_le_bytes());
        assert_corrupt(
            &with_page(
                good.clone(),
                2,
                &leaf(2, &[(BUCKET_LEAF_FLAG, b"meta", &inline)], PAGE),
            ),
            "past the page end",
        );
        // a deep chain of single-child branches: 70 pages, deeper than MAX_DEPTH
        let mut deep = meta_page(0, 2, 75, 2, NO_FREELIST);
        deep.extend(meta_page(1, 2, 75, 1, NO_FREELIST));
        deep.extend(leaf(2, &[(BUCKET_LEAF_FLAG, b"key", &bucket_at(3))], PAGE));
        for id in 3..75u64 {
            deep.extend(branch(id, &[(b"a", id + 1)]));
        }
        assert_corrupt(&deep, "levels deep");
        // the meta claims more pages than the file holds
        let mut short = good.clone();
        short.truncate(5 * PAGE);
        assert_corrupt(&short, "only 20480 bytes are present");
    }

    #[test]
    fn freelist_accounting() {
        // page 7 is the freelist, page 8 is free
        let mut db = etcd_like();
        for meta in 0..2 {
            let txid = 10 - meta as u64;
            db = with_page(db, meta, &meta_page(meta as u64, 2, 9, txid, 7));
        }
        let mut free = page(7, FREELIST_PAGE, 1, 0, PAGE);
        free[PAGE_HEADER..PAGE_HEADER + 8].copy_from_slice(&8u64.to_le_bytes());
        db.extend(&free);
        db.extend(vec![0u8; PAGE]);
        let (stats, _) = walk(&db).unwrap();
        assert_eq!(stats.free_pages, Some(1));
        // a reachable page on the freelist
        free[PAGE_HEADER..PAGE_HEADER + 8].copy_from_slice(&4u64.to_le_bytes());
        assert_corrupt(
            &with_page(db.clone(), 7, &free),
            "page 4: reachable and on the freelist",
        );
        // a page neither reachable nor free
        let mut empty = page(7, FREELIST_PAGE, 0, 0, PAGE);
        assert_corrupt(
            &with_page(db.clone(), 7, &empty),
            "page 8: neither reachable nor free",
        );
        // a count larger than the page
        empty[10..12].copy_from_slice(&u16::MAX.to_le_bytes());
        empty[PAGE_HEADER..PAGE_HEADER + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_corrupt(&with_page(db, 7, &empty), "has room for");
    }

    #[test]
    fn no_byte_flip_panics_or_hangs() {
        let good = etcd_like();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut failures = 0;
        for _ in 0..20_000 {
            let mut db = good.clone();
            for _ in 0..(next() % 4 + 1) {
                let at = (next() % db.len() as u64) as usize;
                db[at] = next() as u8;
            }
            if walk(&db).is_err() {
                failures += 1;
            }
        }
        // most bytes are unused page space; those hitting headers and elements are caught
        assert!(
            failures > 200,
            "only {failures} of 20000 mutations were caught"
        );
        // every single position set to 0xff
        for at in 0..good.len() {
            let mut db = good.clone();
            db[at] = 0xff;
            let _ = walk(&db);
        }
    }
}
