//! The JSON state reader: a window over the input, an item splitter, and one
//! parse per pod.
//!
//! serde_json's reader over `io::Read` takes one byte per call, and each item
//! was parsed three times (raw text, a kind sniff, the pod). Here a scanner
//! finds where each value ends in a large window (strings and escapes
//! skipped, brackets counted) and hands its bytes to serde_json's slice
//! parser once; pods go straight into [`PartialPod`]. Memory is the window
//! plus the largest item. The document around the items (`{`, keys, `,`,
//! `]`) is read here by hand, with serde_json's own error texts and
//! positions, so a malformed file is reported as before.

use std::io::Read;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::ClusterState;
use crate::capacity::record::{PartialPod, PartialSpec, PartialStatus, partial_meta};

/// Bytes asked of the reader at a time (the old reader's buffer), so the
/// size bound trips at the same point.
const READ_CHUNK: usize = 1 << 16;

/// The window's first size; it doubles only for an item larger than it.
pub(super) const WINDOW: usize = 1 << 16;

/// serde_json's error texts for what the hand-read frame reports.
const EOF_LIST: &str = "EOF while parsing a list";
const EOF_OBJECT: &str = "EOF while parsing an object";
const EOF_VALUE: &str = "EOF while parsing a value";
const EXPECTED_COLON: &str = "expected `:`";
const LIST_COMMA_OR_END: &str = "expected `,` or `]`";
const OBJECT_COMMA_OR_END: &str = "expected `,` or `}`";
const KEY_NOT_STRING: &str = "key must be a string";
const TRAILING_CHARACTERS: &str = "trailing characters";
const TRAILING_COMMA: &str = "trailing comma";
const INVALID_UNICODE: &str = "invalid unicode code point";

/// A place in the input as serde_json reports it: the line (from 1) and the
/// bytes read on it so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    line: usize,
    col: usize,
}

impl Pos {
    const START: Pos = Pos { line: 1, col: 0 };

    /// The position after reading `bytes` from here.
    fn after(self, bytes: &[u8]) -> Pos {
        match memchr::memrchr(b'\n', bytes) {
            Some(last) => Pos {
                line: self.line + memchr::memchr_iter(b'\n', bytes).count(),
                col: bytes.len() - last - 1,
            },
            None => Pos {
                line: self.line,
                col: self.col + bytes.len(),
            },
        }
    }

    /// Where a position serde_json gives inside a slice that starts here lies
    /// in the whole input.
    fn within(self, line: usize, col: usize) -> Pos {
        if line <= 1 {
            Pos {
                line: self.line,
                col: self.col + col,
            }
        } else {
            Pos {
                line: self.line + line - 1,
                col,
            }
        }
    }
}

/// Why the read stopped.
pub(super) enum Fail {
    /// The reader failed (or the size bound was hit).
    Io(std::io::Error),
    /// serde_json's text, with the position in the whole input.
    Json(String),
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Self {
        Fail::Io(e)
    }
}

fn at(msg: &str, pos: Pos) -> Fail {
    Fail::Json(format!("{msg} at line {} column {}", pos.line, pos.col))
}

/// serde_json's message without its position.
fn code_text(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// The index in `text` of a position serde_json gives for it.
fn offset_of(text: &[u8], line: usize, col: usize) -> usize {
    let line_start = if line <= 1 {
        0
    } else {
        memchr::memchr_iter(b'\n', text)
            .nth(line - 2)
            .map_or(text.len(), |i| i + 1)
    };
    (line_start + col).min(text.len())
}

/// A serde_json error from parsing `text`, which starts at `start`, placed in
/// the whole input as the streaming reader placed it: that reader counts a
/// control character it stopped at, the slice reader does too except when
/// it skips a string (`skipped`: read as [`IgnoredAny`]).
fn relocated(e: &serde_json::Error, start: Pos, text: &[u8], skipped: bool) -> Fail {
    if e.line() == 0 {
        return Fail::Json(e.to_string());
    }
    let code = code_text(e);
    let mut pos = start.within(e.line(), e.column());
    if skipped && code.starts_with("control character") {
        let i = offset_of(text, e.line(), e.column());
        if let Some(b) = text.get(i..=i) {
            pos = pos.after(b);
        }
    }
    at(&code, pos)
}

/// `parse`'s error for a value cut at `n` bytes of `rest`: an escape at the
/// end of a string makes serde_json read past the scanned end, as the
/// streaming reader did, so an end of input there is looked at again with
/// what follows.
fn parse_error<T>(
    parse: impl Fn(&[u8]) -> serde_json::Result<T>,
    e: serde_json::Error,
    (rest, n): (&[u8], usize),
    start: Pos,
    skipped: bool,
) -> Fail {
    if e.is_eof()
        && n < rest.len()
        && let Err(wider) = parse(rest)
        && !wider.is_eof()
        && code_text(&wider) != TRAILING_CHARACTERS
    {
        return relocated(&wider, start, rest, skipped);
    }
    relocated(&e, start, &rest[..n], skipped)
}

/// An error raised while the old streaming parser was inside the document:
/// serde_json kept a position already in the text, else added where it was.
fn positioned(msg: &str, pos: Pos) -> Fail {
    let e = <serde_json::Error as serde::de::Error>::custom(msg);
    if e.line() == 0 {
        at(msg, pos)
    } else {
        Fail::Json(e.to_string())
    }
}

/// Where a JSON value that starts at `text[0]` ends, found without parsing
/// it; resumable when the text grows. Strings are skipped with their escapes
/// and only the brackets of the value's own kind are counted: in valid JSON
/// the other kind balances inside, and in invalid JSON the parser stops at
/// or before the end found, so the slice holds the error.
#[derive(Debug, Default)]
pub(super) struct Scan {
    i: usize,
    depth: usize,
    in_string: bool,
    open: u8,
    close: u8,
    scalar: bool,
}

fn is_delimiter(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\n' | b'\t' | b'\r' | b',' | b']' | b'}' | b'[' | b'{' | b'"' | b':'
    )
}

impl Scan {
    /// The value's length once `text` holds all of it.
    pub(super) fn end(&mut self, text: &[u8]) -> Option<usize> {
        if self.i == 0 {
            let first = *text.first()?;
            match first {
                b'{' | b'[' => {
                    self.open = first;
                    self.close = if first == b'{' { b'}' } else { b']' };
                    self.depth = 1;
                }
                b'"' => {
                    self.in_string = true;
                    self.depth = 0;
                }
                _ => self.scalar = true,
            }
            self.i = 1;
        }
        if self.scalar {
            let found = text[self.i..].iter().position(|&b| is_delimiter(b));
            return match found {
                Some(k) => Some(self.i + k),
                None => {
                    self.i = text.len();
                    None
                }
            };
        }
        loop {
            if self.in_string {
                let Some(k) = memchr::memchr2(b'"', b'\\', &text[self.i..]) else {
                    self.i = text.len();
                    return None;
                };
                let j = self.i + k;
                if text[j] == b'\\' {
                    if j + 1 >= text.len() {
                        self.i = j;
                        return None;
                    }
                    self.i = j + 2;
                    continue;
                }
                self.in_string = false;
                self.i = j + 1;
                if self.depth == 0 {
                    return Some(self.i);
                }
                continue;
            }
            let Some(k) = memchr::memchr3(self.open, self.close, b'"', &text[self.i..]) else {
                self.i = text.len();
                return None;
            };
            let j = self.i + k;
            self.i = j + 1;
            match text[j] {
                b'"' => self.in_string = true,
                b if b == self.open => self.depth += 1,
                _ => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(self.i);
                    }
                }
            }
        }
    }

    /// A scalar's end is where serde_json stops reading it, not the next
    /// delimiter (`12a` is `12`, then `a`).
    fn is_scalar(&self) -> bool {
        self.scalar
    }
}

/// A window over the input: `buf[at..end]` is read and not yet consumed.
struct Window<R> {
    reader: R,
    buf: Vec<u8>,
    at: usize,
    end: usize,
    eof: bool,
    /// The position of `buf[at]`.
    pos: Pos,
    size: usize,
}

impl<R: Read> Window<R> {
    fn new(reader: R, size: usize) -> Self {
        Window {
            reader,
            buf: Vec::new(),
            at: 0,
            end: 0,
            eof: false,
            pos: Pos::START,
            size: size.max(1),
        }
    }

    fn rest(&self) -> &[u8] {
        &self.buf[self.at..self.end]
    }

    /// Reads more, keeping what is not consumed; false at the end of input.
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.end == self.buf.len() && self.at > 0 {
            self.buf.copy_within(self.at..self.end, 0);
            self.end -= self.at;
            self.at = 0;
        }
        if self.end == self.buf.len() {
            let grow = self.buf.len().max(self.size);
            debug_assert!(grow > 0);
            self.buf.resize(self.buf.len() + grow, 0);
        }
        let upto = self.buf.len().min(self.end + READ_CHUNK);
        loop {
            match self.reader.read(&mut self.buf[self.end..upto]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn consume(&mut self, n: usize) {
        self.pos = self.pos.after(&self.buf[self.at..self.at + n]);
        self.at += n;
    }

    /// Skips whitespace; the next byte, not consumed.
    fn peek(&mut self) -> std::io::Result<Option<u8>> {
        loop {
            let rest = self.rest();
            let ws = rest
                .iter()
                .position(|b| !matches!(b, b' ' | b'\n' | b'\t' | b'\r'));
            match ws {
                Some(k) => {
                    self.consume(k);
                    return Ok(Some(self.buf[self.at]));
                }
                None => {
                    let n = rest.len();
                    self.consume(n);
                    if !self.fill()? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Where serde_json reports an error at the peeked byte (after it), or
    /// at the end of input.
    fn peek_pos(&self) -> Pos {
        match self.rest().first() {
            Some(_) => self.pos.after(&self.rest()[..1]),
            None => self.pos,
        }
    }

    fn peek_error(&self, msg: &str) -> Fail {
        at(msg, self.peek_pos())
    }

    /// The length of the next value (after whitespace), all of it in
    /// [`Window::rest`]. A value the input cuts short is reported with the
    /// error `check` finds in what there is.
    fn slice(
        &mut self,
        check: impl Fn(&[u8]) -> serde_json::Result<()>,
        skipped: bool,
    ) -> Result<usize, Fail> {
        if self.peek()?.is_none() {
            return Err(self.peek_error(EOF_VALUE));
        }
        let mut scan = Scan::default();
        let complete = loop {
            if let Some(n) = scan.end(self.rest()) {
                break Some(n);
            }
            if !self.fill()? {
                break None;
            }
        };
        let start = self.pos;
        let Some(n) = complete else {
            let text = self.rest();
            if scan.is_scalar() {
                return Ok(text.len());
            }
            return Err(match check(text) {
                Err(e) => relocated(&e, start, text, skipped),
                Ok(()) => at(EOF_VALUE, start.after(text)),
            });
        };
        if !scan.is_scalar() {
            return Ok(n);
        }
        // One byte more: serde_json decides where a scalar ends (`12a` is
        // `12`, then `a`).
        match serde_json::from_slice::<IgnoredAny>(&self.rest()[..n + 1]) {
            Err(e) if code_text(&e) == TRAILING_CHARACTERS && e.line() == 1 => Ok(e.column() - 1),
            Err(e) => Err(relocated(&e, start, &self.rest()[..n + 1], true)),
            Ok(_) => Ok(n),
        }
    }

    /// The next value, parsed by `parse` from its own bytes, then consumed.
    fn value<T>(&mut self, parse: impl Fn(&[u8]) -> serde_json::Result<T>) -> Result<T, Fail> {
        let n = self.slice(|text| parse(text).map(drop), false)?;
        let value = match parse(&self.rest()[..n]) {
            Ok(v) => v,
            Err(e) => return Err(parse_error(&parse, e, (self.rest(), n), self.pos, false)),
        };
        self.consume(n);
        Ok(value)
    }

    /// Where the old reader stood when an item's error surfaced: past the
    /// blanks after it and the byte that follows (a `,` or `]` read, the
    /// next peeked).
    fn after_item(&mut self) -> Result<Pos, Fail> {
        match self.peek()? {
            Some(b']') => {
                self.consume(1);
                Ok(self.pos)
            }
            Some(b',') => {
                self.consume(1);
                self.peek()?;
                Ok(self.peek_pos())
            }
            _ => Ok(self.peek_pos()),
        }
    }
}

/// The slice of a Pod the fast path reads, with `kind`: anything it is not
/// sure of (another kind, no kind, a repeated field, a type error) is left
/// to the path that reads items as before.
struct FastPod<'k> {
    default_kind: Option<&'k str>,
}

/// `metadata` through the same function [`PartialPod`] uses.
struct Meta(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta);

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        partial_meta(d).map(Meta)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Kind,
    Metadata,
    Spec,
    Status,
    #[serde(other)]
    Other,
}

/// Not a pod the fast path is sure of; the caller reads it the old way.
fn defer<E: serde::de::Error>() -> E {
    E::custom("deferred")
}

impl<'de> serde::de::DeserializeSeed<'de> for FastPod<'_> {
    type Value = PartialPod;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<PartialPod, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for FastPod<'_> {
    type Value = PartialPod;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Pod")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<PartialPod, A::Error> {
        let mut kind_seen = false;
        let mut metadata = None;
        let mut spec: Option<Option<PartialSpec>> = None;
        let mut status: Option<Option<PartialStatus>> = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Kind => {
                    let kind: Option<std::borrow::Cow<'de, str>> = map.next_value()?;
                    if kind_seen || kind.as_deref() != Some("Pod") {
                        return Err(defer());
                    }
                    kind_seen = true;
                }
                Field::Metadata if metadata.is_none() => {
                    metadata = Some(map.next_value::<Meta>()?.0);
                }
                Field::Spec if spec.is_none() => spec = Some(map.next_value()?),
                Field::Status if status.is_none() => status = Some(map.next_value()?),
                Field::Metadata | Field::Spec | Field::Status => return Err(defer()),
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !kind_seen && self.default_kind != Some("Pod") {
            return Err(defer());
        }
        Ok(PartialPod {
            metadata: metadata.unwrap_or_default(),
            spec: spec.flatten(),
            status: status.flatten(),
        })
    }
}

/// A pod read in one parse, or `None` when the item must be read the old way.
pub(super) fn fast_pod(text: &[u8], default_kind: Option<&str>) -> Option<PartialPod> {
    let text = std::str::from_utf8(text).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let pod = serde::de::DeserializeSeed::deserialize(FastPod { default_kind }, &mut de).ok()?;
    de.end().ok()?;
    Some(pod)
}

/// How `items` must look: what the old reader's visitor accepted.
struct ItemsShape;

impl<'de> serde::de::Visitor<'de> for ItemsShape {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of items")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

impl<'de> Deserialize<'de> for ItemsShape {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemsShape).map(|()| ItemsShape)
    }
}

/// Reads a JSON state document whose first non-blank byte is `{`.
pub(super) fn read<R: Read>(
    reader: R,
    window: usize,
    state: &mut ClusterState,
) -> Result<(), Fail> {
    let mut w = Window::new(reader, window);
    let mut doc = Doc {
        state,
        path: "input".to_string(),
        kindless: Vec::new(),
    };
    doc.object(&mut w)?;
    if w.peek()?.is_some() {
        return Err(w.peek_error(TRAILING_CHARACTERS));
    }
    Ok(())
}

/// `items` that is not a list: fine if `null`, else the old reader's type
/// error, where it stood (after the byte it peeked past a number or `{`).
fn items_shape<R: Read>(w: &mut Window<R>) -> Result<(), Fail> {
    let shape = |t: &[u8]| serde_json::from_slice::<ItemsShape>(t).map(drop);
    let n = w.slice(shape, false)?;
    let (rest, start) = (w.rest(), w.pos);
    match shape(&rest[..n]) {
        Ok(()) => {
            w.consume(n);
            Ok(())
        }
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            let mut pos = start.within(e.line(), e.column());
            if matches!(rest[0], b'-' | b'0'..=b'9' | b'{') {
                let i = offset_of(rest, e.line(), e.column());
                if let Some(b) = rest.get(i..=i) {
                    pos = pos.after(b);
                }
            }
            Err(at(&code_text(&e), pos))
        }
        Err(e) => Err(parse_error(shape, e, (rest, n), start, false)),
    }
}

struct Doc<'s> {
    state: &'s mut ClusterState,
    path: String,
    kindless: Vec<(String, Value)>,
}

impl Doc<'_> {
    /// The top-level object: a List's items are added one by one, any other
    /// object is kept whole.
    fn object<R: Read>(&mut self, w: &mut Window<R>) -> Result<(), Fail> {
        w.peek()?;
        w.consume(1);
        let mut rest = serde_json::Map::new();
        let mut kind: Option<String> = None;
        let mut had_items = false;
        let mut first = true;
        loop {
            let Some(peek) = w.peek()? else {
                return Err(w.peek_error(EOF_OBJECT));
            };
            if peek == b'}' {
                break;
            } else if first {
                first = false;
                if peek != b'"' {
                    return Err(w.peek_error(KEY_NOT_STRING));
                }
            } else if peek == b',' {
                w.consume(1);
                match w.peek()? {
                    Some(b'"') => {}
                    Some(b'}') => return Err(w.peek_error(TRAILING_COMMA)),
                    Some(_) => return Err(w.peek_error(KEY_NOT_STRING)),
                    None => return Err(w.peek_error(EOF_VALUE)),
                }
            } else {
                return Err(w.peek_error(OBJECT_COMMA_OR_END));
            }
            let key = w.value(|t| serde_json::from_slice::<String>(t))?;
            match w.peek()? {
                Some(b':') => w.consume(1),
                Some(_) => return Err(w.peek_error(EXPECTED_COLON)),
                None => return Err(w.peek_error(EOF_OBJECT)),
            }
            if key == "items" {
                had_items = true;
                let item_kind = kind
                    .as_deref()
                    .and_then(super::item_kind)
                    .map(str::to_string);
                self.items(w, item_kind.as_deref())?;
            } else {
                let v = w.value(|t| serde_json::from_slice::<Value>(t))?;
                if key == "kind" {
                    kind = v.as_str().map(str::to_string);
                }
                rest.insert(key, v);
            }
        }
        w.consume(1);
        let after = w.pos;
        let kindless = std::mem::take(&mut self.kindless);
        self.state
            .finish_document(&self.path, kind.as_deref(), had_items, kindless, rest)
            .map_err(|e| positioned(&e.to_string(), after))
    }

    /// `items`: `null`, or a list read item by item.
    fn items<R: Read>(&mut self, w: &mut Window<R>, kind: Option<&str>) -> Result<(), Fail> {
        match w.peek()? {
            None => return Err(w.peek_error(EOF_VALUE)),
            Some(b'[') => w.consume(1),
            Some(_) => return items_shape(w),
        }
        let mut first = true;
        let mut i = 0usize;
        loop {
            let Some(peek) = w.peek()? else {
                return Err(w.peek_error(EOF_LIST));
            };
            if peek == b']' {
                w.consume(1);
                return Ok(());
            } else if first {
                first = false;
            } else if peek == b',' {
                w.consume(1);
                match w.peek()? {
                    Some(b']') => return Err(w.peek_error(TRAILING_COMMA)),
                    Some(_) => {}
                    None => return Err(w.peek_error(EOF_VALUE)),
                }
            } else {
                return Err(w.peek_error(LIST_COMMA_OR_END));
            }
            let path = format!("{}.items[{i}]", self.path);
            self.item(w, &path, kind)?;
            i += 1;
        }
    }

    fn item<R: Read>(
        &mut self,
        w: &mut Window<R>,
        path: &str,
        kind: Option<&str>,
    ) -> Result<(), Fail> {
        let ignore = |text: &[u8]| serde_json::from_slice::<IgnoredAny>(text).map(drop);
        let n = w.slice(ignore, true)?;
        let start = w.pos;
        let text = &w.rest()[..n];
        if let Some(pod) = fast_pod(text, kind) {
            self.state.pods.push(pod.to_record(&mut self.state.strings));
            w.consume(n);
            return Ok(());
        }
        // The old order: the item's syntax, its UTF-8, then its content.
        if let Err(e) = ignore(text) {
            return Err(parse_error(ignore, e, (w.rest(), n), start, true));
        }
        let text = match std::str::from_utf8(text) {
            Ok(text) => text,
            // Where serde_json's raw reader points: at the first bad byte.
            Err(e) => return Err(at(INVALID_UNICODE, start.after(&text[..=e.valid_up_to()]))),
        };
        let added = super::add_item(self.state, text, path, kind);
        w.consume(n);
        match added {
            Ok(None) => Ok(()),
            Ok(Some(v)) => {
                self.kindless.push((path.to_string(), v));
                Ok(())
            }
            Err(e) => {
                let pos = w.after_item()?;
                Err(positioned(&e.to_string(), pos))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::ClusterState;
    use super::*;

    /// Where the scanner ends a value that `text` starts with, fed the whole
    /// text, then byte by byte as a window that grows would feed it.
    fn end(text: &str) -> Option<usize> {
        let whole = Scan::default().end(text.as_bytes());
        let mut scan = Scan::default();
        let mut grown = None;
        for k in 0..=text.len() {
            grown = scan.end(&text.as_bytes()[..k]);
            if grown.is_some() {
                break;
            }
        }
        assert_eq!(whole, grown, "{text}");
        whole
    }

    #[test]
    fn the_scanner_skips_strings_and_counts_its_own_brackets() {
        for (value, tail) in [
            (r#"{"a": "}]\"[{", "b": "\\"}"#, r#", {"c": 1}]"#),
            (r#"{"a": {"b": {"c": {}}}, "d": [{}, [[]]]}"#, "}"),
            (r#"[{"a": [1, "]"]}, 2, "[\\"]"#, "]}"),
            (r#""x\\\"y\u005d""#, ", 1"),
            ("{ \n\t\"a\" : [ ] \r}", "  "),
            ("123", ","),
            ("-1.5e3", "]"),
            ("null", "}"),
            ("nul", ",x"),
        ] {
            let text = format!("{value}{tail}");
            assert_eq!(end(&text), Some(value.len()), "{text}");
        }
        for cut in [
            r#"{"a": "b"#,
            r#"{"a": "\"#,
            r#"[{"a": 1}"#,
            r#""open"#,
            "12",
        ] {
            assert_eq!(end(cut), None, "{cut}");
        }
    }

    #[test]
    fn positions_follow_lines() {
        let p = Pos::START.after(b"ab\ncd");
        assert_eq!(p, Pos { line: 2, col: 2 });
        assert_eq!(p.within(1, 3), Pos { line: 2, col: 5 });
        assert_eq!(p.within(3, 1), Pos { line: 4, col: 1 });
        assert_eq!(offset_of(b"ab\ncd\nef", 3, 1), 7);
    }

    fn read(text: &[u8], window: usize) -> crate::Result<ClusterState> {
        ClusterState::read_windowed(text, 1 << 20, None, window)
    }

    /// Every window size from one byte up, against the default window.
    fn read_all_windows(text: &[u8]) -> Result<String, String> {
        let show = |r: crate::Result<ClusterState>| {
            r.map(|s| {
                format!(
                    "{:?} {:?} {:?} {:?} {:?}",
                    s.pods, s.nodes, s.limit_ranges, s.runtime_classes, s.warnings
                )
            })
            .map_err(|e| e.to_string())
        };
        let want = show(read(text, WINDOW));
        for window in [1, 2, 3, 5, 8, 13, 64] {
            assert_eq!(show(read(text, window)), want, "window {window}");
        }
        want
    }

    #[test]
    fn items_split_across_reads_give_the_same_state() {
        let text = serde_json::to_string_pretty(&json!({"apiVersion": "v1", "items": [
            {"kind": "Node", "metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}}},
            {"kind": "Pod", "metadata": {"name": "p]\"{", "namespace": "ray",
                "labels": {"ray.io/cluster": "c[\\", "ray.io/group": "g"}},
             "spec": {"nodeName": "n1", "containers": [{"name": "c", "env": [{"name": "A", "value": "}}]]"}],
                 "resources": {"requests": {"cpu": "2"}}}]},
             "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            {"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "s"}}]}
        ], "kind": "List"}))
        .unwrap();
        let state = read(text.as_bytes(), 1).unwrap();
        assert_eq!(state.pods.len(), 1);
        assert_eq!(&*state.pods[0].key.1, "p]\"{");
        assert_eq!(
            state.warnings,
            ["ignored input.items[2].items[0]: kind Service (s)"]
        );
        assert!(read_all_windows(text.as_bytes()).is_ok());
    }

    /// What the streaming reader this one replaced said for each input (its
    /// output, recorded): texts and positions are kept.
    #[test]
    fn malformed_input_is_reported_as_before() {
        let base = r#"{"kind":"PodList","items":[{"metadata":{"name":"a"},"status":{"phase":"Pending"}},null,{"kind":"Node","metadata":{"name":"n"}}]}"#;
        let set = |i: usize, b: u8| {
            let mut t = base.as_bytes().to_vec();
            t[i] = b;
            t
        };
        let insert = |i: usize, b: u8| {
            let mut t = base.as_bytes().to_vec();
            t.insert(i, b);
            t
        };
        let cut = |i: usize| base.as_bytes()[..i].to_vec();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                base.into(),
                "input.items[1]: invalid type: null, expected struct Sniff at line 1 column 4",
            ),
            (cut(1), "EOF while parsing an object at line 1 column 1"),
            (cut(2), "EOF while parsing a string at line 1 column 2"),
            (cut(8), "EOF while parsing a value at line 1 column 8"),
            (cut(27), "EOF while parsing a list at line 1 column 27"),
            (insert(0, b'{'), "key must be a string at line 1 column 2"),
            (insert(1, b'"'), "expected `:` at line 1 column 4"),
            (
                set(1, b'}'),
                "input (<unnamed>): object has no kind at line 1 column 2",
            ),
            (
                set(2, b'\n'),
                "control character (\\u0000-\\u001F) found while parsing a string at line 2 column 0",
            ),
            (set(2, b'\\'), "invalid escape at line 1 column 4"),
            (
                set(2, 0xff),
                "invalid unicode code point at line 1 column 3",
            ),
            (insert(7, b':'), "expected value at line 1 column 9"),
            (insert(8, b'['), "expected `,` or `]` at line 1 column 27"),
            (insert(8, b'"'), "expected `,` or `}` at line 1 column 11"),
            (set(8, b'-'), "invalid number at line 1 column 10"),
            (set(8, b'n'), "expected ident at line 1 column 10"),
            (set(17, b'}'), "trailing characters at line 1 column 19"),
            (set(18, b'}'), "trailing comma at line 1 column 19"),
            (
                set(26, b'"'),
                "invalid type: string \"{\", expected a list of items at line 1 column 29",
            ),
            (
                set(26, b'0'),
                "invalid type: integer `0`, expected a list of items at line 1 column 28",
            ),
            (
                insert(26, b'['),
                "input.items[0]: invalid type: map, expected a string at line 1 column 1",
            ),
            (
                set(27, b'"'),
                "input.items[0]: invalid type: string \"\", expected struct Sniff at line 1 column 2",
            ),
            (
                insert(82, b'['),
                "input.items[1] (<unnamed>): invalid type: null, expected struct PartialMeta at line 1 column 5",
            ),
        ];
        for (text, want) in cases {
            let got = read_all_windows(&text).unwrap_err();
            let text = String::from_utf8_lossy(&text);
            assert_eq!(got, format!("not valid JSON: {want}"), "{text}");
        }
    }

    #[test]
    fn the_size_bound_holds_for_json() {
        let text = format!(
            r#"{{"kind":"List","items":[{}]}}"#,
            "{},".repeat(1000) + "{}"
        );
        let err = ClusterState::read(text.as_bytes(), 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger than 100 bytes"), "{err}");
    }

    /// One generated item: its fields as (key, JSON text), in any order.
    fn item() -> impl Strategy<Value = Vec<(String, Value)>> {
        let name = prop::sample::select(vec!["p", "a\"b", "x]}{[", "é\\", "n\nl"]);
        let cpu = prop::sample::select(vec!["250m", "2", "1.5", "1.1.1", "64Mi"]);
        (0..6usize, name, cpu, any::<bool>(), any::<bool>()).prop_map(
            |(kind, name, cpu, ray, bound)| {
                let mut fields = vec![("metadata".to_string(), {
                    let mut m = json!({"name": name, "namespace": "ns", "annotations": {"x": "[{"}});
                    if ray {
                        m["labels"] = json!({"ray.io/cluster": "c", "ray.io/group": name});
                    }
                    m
                })];
                let pod_spec = || {
                    let mut s = json!({"containers": [{"name": "c", "image": "i",
                        "resources": {"requests": {"cpu": cpu}, "limits": {"nvidia.com/gpu": "1"}}}]});
                    if bound {
                        s["nodeName"] = json!("n1");
                    }
                    s
                };
                match kind {
                    0 | 1 => {
                        fields.push(("kind".into(), json!("Pod")));
                        fields.push(("spec".into(), pod_spec()));
                        fields.push(("status".into(), json!({"phase": "Running",
                            "conditions": [{"type": "PodScheduled", "status": "False", "message": name}]})));
                    }
                    2 => {
                        fields.push(("kind".into(), json!("Node")));
                        fields.push(("status".into(), json!({"allocatable": {"cpu": "8"}})));
                    }
                    3 => fields.push(("kind".into(), json!("Service"))),
                    4 => {
                        fields.push(("kind".into(), json!("LimitRange")));
                        fields.push(("spec".into(), json!({"limits": [{"type": "Container",
                            "defaultRequest": {"cpu": cpu}}]})));
                    }
                    _ => {
                        fields.push(("kind".into(), json!("List")));
                        fields.push(("items".into(), json!([{"kind": "Pod", "metadata": {"name": name}, "spec": pod_spec()}])));
                    }
                }
                fields
            },
        )
    }

    fn object(fields: &[(String, Value)], order: &[usize], sep: &str) -> String {
        let mut keys: Vec<usize> = (0..fields.len()).collect();
        keys.sort_by_key(|&i| order.get(i).copied().unwrap_or(0));
        let parts: Vec<String> = keys
            .iter()
            .map(|&i| format!("{}:{sep}{}", json!(fields[i].0), fields[i].1))
            .collect();
        format!("{{{sep}{}{sep}}}", parts.join(&format!(",{sep}")))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn the_fast_reader_equals_parsing_the_whole_value(
            items in prop::collection::vec(item(), 0..12),
            order in prop::collection::vec(0..4usize, 4),
            sep in prop::sample::select(vec!["", " ", "\n  ", "\r\n\t"]),
            kind_first in any::<bool>(),
            window in 1..40usize,
        ) {
            let texts: Vec<String> = items.iter().map(|f| object(f, &order, sep)).collect();
            let list = format!("[{sep}{}{sep}]", texts.join(&format!(",{sep}")));
            let text = if kind_first {
                format!(r#"{{"kind":{sep}"List", "items":{sep}{list}, "metadata": {{"resourceVersion": ""}}}}"#)
            } else {
                format!(r#"{{"apiVersion": "v1", "items": {list},{sep}"kind": "List"}}"#)
            };
            // The reader names the document `input`, as `from_list` does.
            let whole = serde_json::from_str::<Value>(&text).unwrap();
            let want = ClusterState::from_list(whole);
            let got = read(text.as_bytes(), window);
            match (want, got) {
                (Ok(want), Ok(got)) => {
                    prop_assert_eq!(&got.pods, &want.pods);
                    prop_assert_eq!(&got.nodes, &want.nodes);
                    prop_assert_eq!(&got.limit_ranges, &want.limit_ranges);
                    prop_assert_eq!(&got.runtime_classes, &want.runtime_classes);
                    prop_assert_eq!(&got.warnings, &want.warnings);
                }
                (want, got) => prop_assert!(false, "{:?} vs {:?}", want.map(|_| ()), got.map(|_| ())),
            }
        }
    }
}
