//! A small CEL interpreter for CRD `x-kubernetes-validations`.
//!
//! It covers what the real HyperShift / Cluster API CRDs use: literals,
//! `self` / `oldSelf`, field selection (with Kubernetes' `__dash__`-style
//! property-name escaping), optional selection (`.?f`, `[?k]`, `orValue`,
//! `hasValue`, `value`), `has()`, indexing, `in`, `size()`, `&& || ! ?:`,
//! comparisons and arithmetic, conversions (`int string double uint bool`),
//! the macros `all exists exists_one map filter`, the string library
//! (`matches find findAll startsWith endsWith contains lowerAscii upperAscii
//! split indexOf lastIndexOf join trim replace substring`), and the Kubernetes
//! URL, IP/CIDR and duration libraries as far as the CRDs call them.
//!
//! Compilation checks that every function and variable is known, so a rule
//! the interpreter does not understand is *rejected at compile time* (the
//! schema records it as skipped) instead of failing or passing at run time.
//! There is no static type checker and no cost estimation.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use regex::Regex;
use serde_json::Value;

/// Why a CEL expression could not be compiled or evaluated.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum CelError {
    /// The expression is not valid CEL syntax (or uses syntax this
    /// interpreter does not implement).
    #[error("syntax error at offset {offset}: {message}")]
    Syntax {
        /// Byte offset in the expression.
        offset: usize,
        /// What was wrong.
        message: String,
    },
    /// The expression calls a function, or names a variable, this
    /// interpreter does not know.
    #[error("undeclared reference to '{0}'")]
    Undeclared(String),
    /// A regular expression literal does not compile.
    #[error("invalid regular expression {pattern:?}: {message}")]
    Regex {
        /// The pattern.
        pattern: String,
        /// The regex crate's message.
        message: String,
    },
    /// Evaluation failed (no such key, no matching overload, overflow, ...).
    #[error("{0}")]
    Eval(String),
    /// An `x-kubernetes-validations` entry is malformed.
    #[error("invalid validation rule: {0}")]
    Rule(String),
}

fn eval_err<T>(message: impl Into<String>) -> Result<T, CelError> {
    Err(CelError::Eval(message.into()))
}

/// How a list compares for equality (Kubernetes `x-kubernetes-list-type`).
#[derive(Debug, Clone, PartialEq)]
pub enum ListKind {
    /// Order matters.
    Atomic,
    /// `set`: order does not matter.
    Set,
    /// `map` keyed by these fields: order does not matter.
    Map(Arc<[String]>),
}

/// A parsed URL (`url()` of the Kubernetes URL library).
#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    scheme: String,
    host: String,
    port: String,
    path: String,
    query: String,
}

/// A CEL runtime value.
#[derive(Debug, Clone)]
pub enum CelValue {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(Arc<str>),
    Bytes(Arc<[u8]>),
    List(Arc<Vec<CelValue>>, ListKind),
    /// Maps and objects; keys are strings (JSON objects only have string keys).
    Map(Arc<BTreeMap<String, CelValue>>),
    Optional(Option<Box<CelValue>>),
    Duration(i64),
    Url(Arc<Url>),
    Ip(IpAddr),
    Cidr(IpAddr, u8),
    Type(&'static str),
}

impl CelValue {
    /// Convert plain JSON (lists atomic).
    pub fn from_json(value: &Value) -> CelValue {
        match value {
            Value::Null => CelValue::Null,
            Value::Bool(b) => CelValue::Bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    CelValue::Int(i)
                } else if let Some(u) = n.as_u64() {
                    CelValue::Uint(u)
                } else {
                    CelValue::Double(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => CelValue::String(s.as_str().into()),
            Value::Array(items) => CelValue::List(
                Arc::new(items.iter().map(CelValue::from_json).collect()),
                ListKind::Atomic,
            ),
            Value::Object(map) => CelValue::Map(Arc::new(
                map.iter()
                    .map(|(k, v)| (k.clone(), CelValue::from_json(v)))
                    .collect(),
            )),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            CelValue::Null => "null_type",
            CelValue::Bool(_) => "bool",
            CelValue::Int(_) => "int",
            CelValue::Uint(_) => "uint",
            CelValue::Double(_) => "double",
            CelValue::String(_) => "string",
            CelValue::Bytes(_) => "bytes",
            CelValue::List(..) => "list",
            CelValue::Map(_) => "map",
            CelValue::Optional(_) => "optional_type",
            CelValue::Duration(_) => "google.protobuf.Duration",
            CelValue::Url(_) => "kubernetes.URL",
            CelValue::Ip(_) => "net.IP",
            CelValue::Cidr(..) => "net.CIDR",
            CelValue::Type(_) => "type",
        }
    }

    /// CEL's heterogeneous equality (numbers compare across types; lists of
    /// kind set/map ignore order).
    pub fn equals(&self, other: &CelValue) -> bool {
        use CelValue::*;
        match (self, other) {
            (Null, Null) => true,
            (Bool(a), Bool(b)) => a == b,
            (String(a), String(b)) => a == b,
            (Bytes(a), Bytes(b)) => a == b,
            (Int(_) | Uint(_) | Double(_), Int(_) | Uint(_) | Double(_)) => {
                numeric_cmp(self, other) == Some(std::cmp::Ordering::Equal)
            }
            (List(a, kind), List(b, _)) => {
                if a.len() != b.len() {
                    return false;
                }
                match kind {
                    ListKind::Atomic => a.iter().zip(b.iter()).all(|(x, y)| x.equals(y)),
                    _ => {
                        let mut used = vec![false; b.len()];
                        a.iter().all(|x| {
                            match b
                                .iter()
                                .enumerate()
                                .position(|(i, y)| !used[i] && x.equals(y))
                            {
                                Some(i) => {
                                    used[i] = true;
                                    true
                                }
                                None => false,
                            }
                        })
                    }
                }
            }
            (Map(a), Map(b)) => {
                a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| v.equals(w)))
            }
            (Optional(a), Optional(b)) => match (a, b) {
                (None, None) => true,
                (Some(x), Some(y)) => x.equals(y),
                _ => false,
            },
            (Duration(a), Duration(b)) => a == b,
            (Url(a), Url(b)) => a == b,
            (Ip(a), Ip(b)) => a == b,
            (Cidr(a, p), Cidr(b, q)) => a == b && p == q,
            (Type(a), Type(b)) => a == b,
            _ => false,
        }
    }

    /// Rendering for `string()` and error messages.
    fn display(&self) -> String {
        match self {
            CelValue::Null => "null".into(),
            CelValue::Bool(b) => b.to_string(),
            CelValue::Int(i) => i.to_string(),
            CelValue::Uint(u) => u.to_string(),
            CelValue::Double(d) => d.to_string(),
            CelValue::String(s) => s.to_string(),
            CelValue::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            CelValue::Duration(n) => format!("{}s", *n as f64 / 1e9),
            CelValue::Ip(ip) => ip.to_string(),
            CelValue::Cidr(ip, p) => format!("{ip}/{p}"),
            CelValue::List(items, _) => {
                format!(
                    "[{}]",
                    items
                        .iter()
                        .map(CelValue::display)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            other => other.type_name().to_string(),
        }
    }
}

fn numeric_cmp(a: &CelValue, b: &CelValue) -> Option<std::cmp::Ordering> {
    use CelValue::*;
    match (a, b) {
        (Int(x), Int(y)) => Some(x.cmp(y)),
        (Uint(x), Uint(y)) => Some(x.cmp(y)),
        (Int(x), Uint(y)) => Some(if *x < 0 {
            std::cmp::Ordering::Less
        } else {
            (*x as u64).cmp(y)
        }),
        (Uint(x), Int(y)) => Some(if *y < 0 {
            std::cmp::Ordering::Greater
        } else {
            x.cmp(&(*y as u64))
        }),
        (Int(x), Double(y)) => (*x as f64).partial_cmp(y),
        (Double(x), Int(y)) => x.partial_cmp(&(*y as f64)),
        (Uint(x), Double(y)) => (*x as f64).partial_cmp(y),
        (Double(x), Uint(y)) => x.partial_cmp(&(*y as f64)),
        (Double(x), Double(y)) => x.partial_cmp(y),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    Ident(String),
    Punct(&'static str),
}

const PUNCTS: &[&str] = &[
    "&&", "||", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",", ":", "?", "!", "-",
    "+", "*", "/", "%", "<", ">",
];

fn syntax<T>(offset: usize, message: impl Into<String>) -> Result<T, CelError> {
    Err(CelError::Syntax {
        offset,
        message: message.into(),
    })
}

fn lex(src: &str) -> Result<Vec<(usize, Tok)>, CelError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        // String and bytes literals, with optional r/b prefixes.
        let mut j = i;
        let mut raw = false;
        let mut is_bytes = false;
        while j < bytes.len() && j < i + 2 && matches!(bytes[j], b'r' | b'R' | b'b' | b'B') {
            if matches!(bytes[j], b'r' | b'R') {
                raw = true;
            } else {
                is_bytes = true;
            }
            j += 1;
        }
        if j < bytes.len() && (bytes[j] == b'"' || bytes[j] == b'\'') {
            let quote = bytes[j];
            let triple = bytes.get(j + 1) == Some(&quote) && bytes.get(j + 2) == Some(&quote);
            let body_start = if triple { j + 3 } else { j + 1 };
            let (text, end) = read_string(src, body_start, quote, triple, raw, start)?;
            i = end;
            if is_bytes {
                out.push((start, Tok::Bytes(text.into_bytes())));
            } else {
                out.push((start, Tok::Str(text)));
            }
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let (tok, end) = read_number(src, i)?;
            out.push((start, tok));
            i = end;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push((start, Tok::Ident(src[start..i].to_string())));
            continue;
        }
        match PUNCTS.iter().find(|p| src[i..].starts_with(**p)) {
            Some(p) => {
                out.push((start, Tok::Punct(p)));
                i += p.len();
            }
            None => {
                return syntax(
                    i,
                    format!(
                        "unexpected character {:?}",
                        src[i..].chars().next().unwrap_or(' ')
                    ),
                );
            }
        }
    }
    Ok(out)
}

fn read_string(
    src: &str,
    mut i: usize,
    quote: u8,
    triple: bool,
    raw: bool,
    start: usize,
) -> Result<(String, usize), CelError> {
    let bytes = src.as_bytes();
    let mut out = String::new();
    loop {
        if i >= bytes.len() {
            return syntax(start, "unterminated string literal");
        }
        let c = bytes[i];
        if c == quote {
            if !triple {
                return Ok((out, i + 1));
            }
            if bytes.get(i + 1) == Some(&quote) && bytes.get(i + 2) == Some(&quote) {
                return Ok((out, i + 3));
            }
        }
        if !triple && (c == b'\n' || c == b'\r') {
            return syntax(start, "newline in string literal");
        }
        if c == b'\\' && !raw {
            let Some(&e) = bytes.get(i + 1) else {
                return syntax(i, "dangling escape");
            };
            i += 2;
            match e {
                b'\\' => out.push('\\'),
                b'\'' => out.push('\''),
                b'"' => out.push('"'),
                b'`' => out.push('`'),
                b'?' => out.push('?'),
                b'n' => out.push('\n'),
                b't' => out.push('\t'),
                b'r' => out.push('\r'),
                b'a' => out.push('\u{7}'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'v' => out.push('\u{b}'),
                b'x' | b'X' | b'u' | b'U' => {
                    let len = match e {
                        b'x' | b'X' => 2,
                        b'u' => 4,
                        _ => 8,
                    };
                    let hex = src.get(i..i + len).ok_or(CelError::Syntax {
                        offset: i,
                        message: "short escape".into(),
                    })?;
                    let code = u32::from_str_radix(hex, 16).map_err(|_| CelError::Syntax {
                        offset: i,
                        message: "bad hex escape".into(),
                    })?;
                    out.push(char::from_u32(code).ok_or(CelError::Syntax {
                        offset: i,
                        message: "bad code point".into(),
                    })?);
                    i += len;
                }
                b'0'..=b'3' => {
                    let oct = src.get(i - 1..i + 2).ok_or(CelError::Syntax {
                        offset: i,
                        message: "short octal".into(),
                    })?;
                    let code = u32::from_str_radix(oct, 8).map_err(|_| CelError::Syntax {
                        offset: i,
                        message: "bad octal escape".into(),
                    })?;
                    out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    i += 2;
                }
                other => return syntax(i - 2, format!("invalid escape \\{}", other as char)),
            }
            continue;
        }
        let ch = src[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
}

fn read_number(src: &str, start: usize) -> Result<(Tok, usize), CelError> {
    let bytes = src.as_bytes();
    let mut i = start;
    if src[i..].starts_with("0x") || src[i..].starts_with("0X") {
        i += 2;
        let digits_start = i;
        while i < bytes.len() && bytes[i].is_ascii_hexdigit() {
            i += 1;
        }
        let digits = &src[digits_start..i];
        if bytes.get(i).is_some_and(|b| *b == b'u' || *b == b'U') {
            let v = u64::from_str_radix(digits, 16).map_err(|e| CelError::Syntax {
                offset: start,
                message: e.to_string(),
            })?;
            return Ok((Tok::Uint(v), i + 1));
        }
        let v = i64::from_str_radix(digits, 16).map_err(|e| CelError::Syntax {
            offset: start,
            message: e.to_string(),
        })?;
        return Ok((Tok::Int(v), i));
    }
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    let mut is_double = false;
    if i < bytes.len() && bytes[i] == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
        is_double = true;
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
        let mut j = i + 1;
        if j < bytes.len() && (bytes[j] == b'+' || bytes[j] == b'-') {
            j += 1;
        }
        if j < bytes.len() && bytes[j].is_ascii_digit() {
            is_double = true;
            i = j;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
        }
    }
    let text = &src[start..i];
    if is_double {
        let v: f64 = text.parse().map_err(|_| CelError::Syntax {
            offset: start,
            message: "bad double".into(),
        })?;
        return Ok((Tok::Double(v), i));
    }
    if bytes.get(i).is_some_and(|b| *b == b'u' || *b == b'U') {
        let v: u64 = text.parse().map_err(|_| CelError::Syntax {
            offset: start,
            message: "bad uint".into(),
        })?;
        return Ok((Tok::Uint(v), i + 1));
    }
    let v: i64 = text.parse().map_err(|_| CelError::Syntax {
        offset: start,
        message: "int literal out of range".into(),
    })?;
    Ok((Tok::Int(v), i))
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MacroKind {
    All,
    Exists,
    ExistsOne,
    Map,
    Filter,
}

#[derive(Debug, Clone)]
enum Expr {
    Lit(CelValue),
    Ident(String),
    Select {
        operand: Box<Expr>,
        field: String,
        optional: bool,
    },
    Index {
        operand: Box<Expr>,
        index: Box<Expr>,
        optional: bool,
    },
    Call {
        target: Option<Box<Expr>>,
        name: String,
        args: Vec<Expr>,
    },
    List(Vec<Expr>),
    Map(Vec<(Expr, Expr)>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
    Has(Box<Expr>, String),
    Macro {
        kind: MacroKind,
        range: Box<Expr>,
        var: String,
        filter: Option<Box<Expr>>,
        body: Box<Expr>,
    },
    Regex(Arc<LazyRegex>),
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    len: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }
    fn offset(&self) -> usize {
        self.toks.get(self.pos).map(|(o, _)| *o).unwrap_or(self.len)
    }
    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str) -> Result<(), CelError> {
        if self.eat(p) {
            Ok(())
        } else {
            syntax(self.offset(), format!("expected '{p}'"))
        }
    }

    fn expr(&mut self) -> Result<Expr, CelError> {
        self.depth += 1;
        if self.depth > 200 {
            return syntax(self.offset(), "expression nested too deeply");
        }
        let cond = self.or()?;
        let out = if self.eat("?") {
            let then = self.or()?;
            self.expect(":")?;
            let otherwise = self.expr()?;
            Expr::Cond(Box::new(cond), Box::new(then), Box::new(otherwise))
        } else {
            cond
        };
        self.depth -= 1;
        Ok(out)
    }

    fn or(&mut self) -> Result<Expr, CelError> {
        let mut left = self.and()?;
        while self.eat("||") {
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, CelError> {
        let mut left = self.relation()?;
        while self.eat("&&") {
            let right = self.relation()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn relation(&mut self) -> Result<Expr, CelError> {
        let mut left = self.addition()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct("==")) => BinOp::Eq,
                Some(Tok::Punct("!=")) => BinOp::Ne,
                Some(Tok::Punct("<")) => BinOp::Lt,
                Some(Tok::Punct("<=")) => BinOp::Le,
                Some(Tok::Punct(">")) => BinOp::Gt,
                Some(Tok::Punct(">=")) => BinOp::Ge,
                Some(Tok::Ident(s)) if s == "in" => BinOp::In,
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.addition()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
    }

    fn addition(&mut self) -> Result<Expr, CelError> {
        let mut left = self.multiplication()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct("+")) => BinOp::Add,
                Some(Tok::Punct("-")) => BinOp::Sub,
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.multiplication()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
    }

    fn multiplication(&mut self) -> Result<Expr, CelError> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct("*")) => BinOp::Mul,
                Some(Tok::Punct("/")) => BinOp::Div,
                Some(Tok::Punct("%")) => BinOp::Rem,
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.unary()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
    }

    fn unary(&mut self) -> Result<Expr, CelError> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("-") {
            // Fold negative literals so that i64::MIN parses.
            if let Some(Tok::Int(_) | Tok::Double(_)) = self.peek() {
                let operand = self.member()?;
                return Ok(match operand {
                    Expr::Lit(CelValue::Int(i)) => Expr::Lit(CelValue::Int(-i)),
                    Expr::Lit(CelValue::Double(d)) => Expr::Lit(CelValue::Double(-d)),
                    other => Expr::Neg(Box::new(other)),
                });
            }
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.member()
    }

    fn args(&mut self) -> Result<Vec<Expr>, CelError> {
        let mut args = Vec::new();
        if self.eat(")") {
            return Ok(args);
        }
        loop {
            args.push(self.expr()?);
            if self.eat(")") {
                return Ok(args);
            }
            self.expect(",")?;
        }
    }

    fn member(&mut self) -> Result<Expr, CelError> {
        let mut e = self.primary()?;
        loop {
            if self.eat(".") {
                let optional = self.eat("?");
                let offset = self.offset();
                let Some(Tok::Ident(name)) = self.peek().cloned() else {
                    return syntax(offset, "expected field name");
                };
                self.pos += 1;
                if !optional && self.eat("(") {
                    let args = self.args()?;
                    e = make_member_call(e, name, args, offset)?;
                } else {
                    e = Expr::Select {
                        operand: Box::new(e),
                        field: name,
                        optional,
                    };
                }
            } else if self.eat("[") {
                let optional = self.eat("?");
                let index = self.expr()?;
                self.expect("]")?;
                e = Expr::Index {
                    operand: Box::new(e),
                    index: Box::new(index),
                    optional,
                };
            } else {
                return Ok(e);
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, CelError> {
        let offset = self.offset();
        let Some(tok) = self.peek().cloned() else {
            return syntax(offset, "unexpected end of expression");
        };
        self.pos += 1;
        match tok {
            Tok::Int(i) => Ok(Expr::Lit(CelValue::Int(i))),
            Tok::Uint(u) => Ok(Expr::Lit(CelValue::Uint(u))),
            Tok::Double(d) => Ok(Expr::Lit(CelValue::Double(d))),
            Tok::Str(s) => Ok(Expr::Lit(CelValue::String(s.into()))),
            Tok::Bytes(b) => Ok(Expr::Lit(CelValue::Bytes(b.into()))),
            Tok::Ident(name) => match name.as_str() {
                "true" => Ok(Expr::Lit(CelValue::Bool(true))),
                "false" => Ok(Expr::Lit(CelValue::Bool(false))),
                "null" => Ok(Expr::Lit(CelValue::Null)),
                _ => {
                    if self.eat("(") {
                        let args = self.args()?;
                        if name == "has" {
                            return match args.as_slice() {
                                [
                                    Expr::Select {
                                        operand,
                                        field,
                                        optional: false,
                                    },
                                ] => Ok(Expr::Has(operand.clone(), field.clone())),
                                _ => syntax(offset, "invalid argument to has() macro"),
                            };
                        }
                        Ok(Expr::Call {
                            target: None,
                            name,
                            args,
                        })
                    } else {
                        Ok(Expr::Ident(name))
                    }
                }
            },
            Tok::Punct("(") => {
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Punct("[") => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.expr()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                        if self.eat("]") {
                            break;
                        }
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Punct("{") => {
                let mut entries = Vec::new();
                if !self.eat("}") {
                    loop {
                        let k = self.expr()?;
                        self.expect(":")?;
                        let v = self.expr()?;
                        entries.push((k, v));
                        if self.eat("}") {
                            break;
                        }
                        self.expect(",")?;
                        if self.eat("}") {
                            break;
                        }
                    }
                }
                Ok(Expr::Map(entries))
            }
            Tok::Punct(".") => {
                // Leading-dot qualified identifier: `.self` is unusual; treat as ident.
                match self.peek().cloned() {
                    Some(Tok::Ident(name)) => {
                        self.pos += 1;
                        Ok(Expr::Ident(name))
                    }
                    _ => syntax(offset, "expected identifier after '.'"),
                }
            }
            other => syntax(offset, format!("unexpected token {other:?}")),
        }
    }
}

fn make_member_call(
    target: Expr,
    name: String,
    args: Vec<Expr>,
    offset: usize,
) -> Result<Expr, CelError> {
    let kind = match name.as_str() {
        "all" => Some(MacroKind::All),
        "exists" => Some(MacroKind::Exists),
        "exists_one" => Some(MacroKind::ExistsOne),
        "map" => Some(MacroKind::Map),
        "filter" => Some(MacroKind::Filter),
        _ => None,
    };
    if let Some(kind) = kind {
        let mut args = args.into_iter();
        let var = match args.next() {
            Some(Expr::Ident(v)) => v,
            _ => {
                return syntax(
                    offset,
                    format!("{name}() macro needs an identifier as its first argument"),
                );
            }
        };
        let rest: Vec<Expr> = args.collect();
        let (filter, body) = match (kind, rest.len()) {
            (MacroKind::Map, 2) => {
                let mut it = rest.into_iter();
                let (Some(f), Some(b)) = (it.next(), it.next()) else {
                    return syntax(offset, "map() macro arity");
                };
                (Some(Box::new(f)), Box::new(b))
            }
            (_, 1) => match rest.into_iter().next() {
                Some(b) => (None, Box::new(b)),
                None => return syntax(offset, "macro arity"),
            },
            _ => {
                return syntax(
                    offset,
                    format!("wrong number of arguments to {name}() macro"),
                );
            }
        };
        return Ok(Expr::Macro {
            kind,
            range: Box::new(target),
            var,
            filter,
            body,
        });
    }
    Ok(Expr::Call {
        target: Some(Box::new(target)),
        name,
        args,
    })
}

// ---------------------------------------------------------------------------
// Compile-time checks
// ---------------------------------------------------------------------------

const GLOBAL_FUNCTIONS: &[&str] = &[
    "size", "int", "uint", "double", "string", "bool", "bytes", "dyn", "type", "matches", "isURL",
    "url", "isIP", "ip", "isCIDR", "cidr", "duration",
];
const MEMBER_FUNCTIONS: &[&str] = &[
    "size",
    "matches",
    "find",
    "findAll",
    "startsWith",
    "endsWith",
    "contains",
    "lowerAscii",
    "upperAscii",
    "split",
    "indexOf",
    "lastIndexOf",
    "join",
    "trim",
    "replace",
    "substring",
    "charAt",
    "orValue",
    "hasValue",
    "value",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    "family",
    "prefixLength",
    "ip",
    "masked",
    "isLoopback",
    "isUnspecified",
    "containsIP",
    "containsCIDR",
    "getSeconds",
    "getMilliseconds",
    "getMinutes",
    "getHours",
    "isSorted",
    "sum",
    "min",
    "max",
];

fn check(expr: &mut Expr, scope: &mut Vec<String>) -> Result<(), CelError> {
    match expr {
        Expr::Lit(_) | Expr::Regex(_) => Ok(()),
        Expr::Ident(name) => {
            if scope.iter().any(|s| s == name) {
                Ok(())
            } else {
                Err(CelError::Undeclared(name.clone()))
            }
        }
        Expr::Select { operand, field, .. } => {
            // `optional.none()` / `optional.of(x)` are namespaced functions.
            if let Expr::Ident(ns) = operand.as_ref()
                && ns == "optional"
                && !scope.iter().any(|s| s == "optional")
            {
                return Err(CelError::Undeclared(format!("optional.{field}")));
            }
            check(operand, scope)
        }
        Expr::Has(operand, _) => check(operand, scope),
        Expr::Index { operand, index, .. } => {
            check(operand, scope)?;
            check(index, scope)
        }
        Expr::Call { target, name, args } => {
            if let Some(Expr::Ident(ns)) = target.as_deref()
                && ns == "optional"
                && (name == "of" || name == "none" || name == "ofNonZeroValue")
            {
                for a in args.iter_mut() {
                    check(a, scope)?;
                }
                return Ok(());
            }
            let known = if target.is_some() {
                MEMBER_FUNCTIONS
            } else {
                GLOBAL_FUNCTIONS
            };
            if !known.contains(&name.as_str()) {
                return Err(CelError::Undeclared(name.clone()));
            }
            if let Some(t) = target.as_deref_mut() {
                check(t, scope)?;
            }
            for a in args.iter_mut() {
                check(a, scope)?;
            }
            // Precompile literal regular expressions.
            let regex_arg = match (name.as_str(), target.is_some()) {
                ("matches" | "find" | "findAll", true) => Some(0),
                ("matches", false) => Some(1),
                _ => None,
            };
            if let Some(i) = regex_arg
                && let Some(Expr::Lit(CelValue::String(p))) = args.get(i)
            {
                let re = LazyRegex::new(p).map_err(|message| CelError::Regex {
                    pattern: p.to_string(),
                    message,
                })?;
                args[i] = Expr::Regex(Arc::new(re));
            }
            Ok(())
        }
        Expr::List(items) => items.iter_mut().try_for_each(|i| check(i, scope)),
        Expr::Map(entries) => entries.iter_mut().try_for_each(|(k, v)| {
            check(k, scope)?;
            check(v, scope)
        }),
        Expr::Not(e) | Expr::Neg(e) => check(e, scope),
        Expr::Binary(_, a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
            check(a, scope)?;
            check(b, scope)
        }
        Expr::Cond(a, b, c) => {
            check(a, scope)?;
            check(b, scope)?;
            check(c, scope)
        }
        Expr::Macro {
            range,
            var,
            filter,
            body,
            ..
        } => {
            check(range, scope)?;
            scope.push(var.clone());
            let result = filter
                .as_deref_mut()
                .map_or(Ok(()), |f| check(f, scope))
                .and_then(|()| check(body, scope));
            scope.pop();
            result
        }
    }
}

fn mentions(expr: &Expr, ident: &str) -> bool {
    match expr {
        Expr::Lit(_) | Expr::Regex(_) => false,
        Expr::Ident(name) => name == ident,
        Expr::Select { operand, .. } | Expr::Has(operand, _) => mentions(operand, ident),
        Expr::Index { operand, index, .. } => mentions(operand, ident) || mentions(index, ident),
        Expr::Call { target, args, .. } => {
            target.as_deref().is_some_and(|t| mentions(t, ident))
                || args.iter().any(|a| mentions(a, ident))
        }
        Expr::List(items) => items.iter().any(|i| mentions(i, ident)),
        Expr::Map(entries) => entries
            .iter()
            .any(|(k, v)| mentions(k, ident) || mentions(v, ident)),
        Expr::Not(e) | Expr::Neg(e) => mentions(e, ident),
        Expr::Binary(_, a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
            mentions(a, ident) || mentions(b, ident)
        }
        Expr::Cond(a, b, c) => mentions(a, ident) || mentions(b, ident) || mentions(c, ident),
        Expr::Macro {
            range,
            var,
            filter,
            body,
            ..
        } => {
            mentions(range, ident)
                || (var != ident
                    && (filter.as_deref().is_some_and(|f| mentions(f, ident))
                        || mentions(body, ident)))
        }
    }
}

/// A compiled CEL expression.
#[derive(Debug, Clone)]
pub struct Program {
    expr: Arc<Expr>,
    uses_old_self: bool,
}

impl Program {
    /// Parse and check an expression over the variables `self` and `oldSelf`.
    pub fn compile(source: &str) -> Result<Program, CelError> {
        let toks = lex(source)?;
        let mut parser = Parser {
            toks,
            pos: 0,
            len: source.len(),
            depth: 0,
        };
        let mut expr = parser.expr()?;
        if parser.pos != parser.toks.len() {
            return syntax(parser.offset(), "unexpected trailing input");
        }
        check(
            &mut expr,
            &mut vec!["self".to_string(), "oldSelf".to_string()],
        )?;
        let uses_old_self = mentions(&expr, "oldSelf");
        Ok(Program {
            expr: Arc::new(expr),
            uses_old_self,
        })
    }

    /// Whether the expression mentions `oldSelf` (a transition rule).
    pub fn uses_old_self(&self) -> bool {
        self.uses_old_self
    }

    /// Evaluate with `self` and (for transition rules) `oldSelf` bound.
    pub fn eval(&self, this: &CelValue, old: Option<&CelValue>) -> Result<CelValue, CelError> {
        let mut env = Env {
            vars: vec![("self".to_string(), this.clone())],
        };
        if let Some(old) = old {
            env.vars.push(("oldSelf".to_string(), old.clone()));
        }
        env.eval(&self.expr)
    }
}

// ---------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------

struct Env {
    vars: Vec<(String, CelValue)>,
}

/// Kubernetes escapes property names that are not CEL identifiers.
fn unescape_property(name: &str) -> Option<String> {
    if !name.contains("__") {
        return None;
    }
    const KEYWORDS: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if let Some(inner) = name.strip_prefix("__").and_then(|n| n.strip_suffix("__"))
        && KEYWORDS.contains(&inner)
    {
        return Some(inner.to_string());
    }
    Some(
        name.replace("__underscores__", "\u{0}")
            .replace("__dot__", ".")
            .replace("__dash__", "-")
            .replace("__slash__", "/")
            .replace('\u{0}', "__"),
    )
}

fn map_get<'a>(map: &'a BTreeMap<String, CelValue>, field: &str) -> Option<&'a CelValue> {
    map.get(field)
        .or_else(|| unescape_property(field).and_then(|u| map.get(&u)))
}

fn as_str(v: &CelValue, what: &str) -> Result<Arc<str>, CelError> {
    match v {
        CelValue::String(s) => Ok(s.clone()),
        other => eval_err(format!("no such overload: {what}({})", other.type_name())),
    }
}

fn as_int(v: &CelValue, what: &str) -> Result<i64, CelError> {
    match v {
        CelValue::Int(i) => Ok(*i),
        other => eval_err(format!("no such overload: {what}({})", other.type_name())),
    }
}

/// Compile a regular expression with RE2 (Go) semantics: `\d`, `\w`, `\s`
/// and `\b` are ASCII-only there, Unicode-aware in the `regex` crate by
/// default. Rewriting them keeps the semantics and makes compilation of the
/// CRDs' many patterns much cheaper.
pub fn re2(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&asciify(pattern))
}

/// A regular expression checked for syntax up front and compiled on first
/// use (compiling the hundreds of patterns of the HyperShift CRDs eagerly
/// would dominate the emulator's start-up).
#[derive(Debug)]
pub struct LazyRegex {
    source: String,
    translated: String,
    compiled: std::sync::OnceLock<Result<Regex, String>>,
}

impl LazyRegex {
    /// Check the syntax (RE2 semantics, see [`re2`]); compile later.
    pub fn new(pattern: &str) -> Result<LazyRegex, String> {
        let translated = asciify(pattern);
        regex_syntax::Parser::new()
            .parse(&translated)
            .map_err(|e| e.to_string())?;
        Ok(LazyRegex {
            source: pattern.to_string(),
            translated,
            compiled: std::sync::OnceLock::new(),
        })
    }

    /// The pattern as written in the schema or rule.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `text` contains a match; an error if the pattern cannot be
    /// compiled after all (e.g. it exceeds the size limit).
    pub fn is_match(&self, text: &str) -> Result<bool, String> {
        self.get().map(|re| re.is_match(text))
    }

    fn get(&self) -> Result<&Regex, String> {
        self.compiled
            .get_or_init(|| Regex::new(&self.translated).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)
    }
}

fn asciify(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push(c);
                    break;
                };
                match (next, in_class) {
                    ('d', false) => out.push_str("[0-9]"),
                    ('w', false) => out.push_str("[0-9A-Za-z_]"),
                    ('s', false) => out.push_str("[\\t\\n\\f\\r ]"),
                    ('D', false) => out.push_str("[^0-9]"),
                    ('W', false) => out.push_str("[^0-9A-Za-z_]"),
                    ('S', false) => out.push_str("[^\\t\\n\\f\\r ]"),
                    ('b', false) => out.push_str("(?-u:\\b)"),
                    ('B', false) => out.push_str("(?-u:\\B)"),
                    ('d', true) => out.push_str("0-9"),
                    ('w', true) => out.push_str("0-9A-Za-z_"),
                    ('s', true) => out.push_str("\\t\\n\\f\\r "),
                    (other, _) => {
                        out.push('\\');
                        out.push(other);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push(c);
                // A leading `^` and a leading `]` belong to the class.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push(']');
                    chars.next();
                }
            }
            '[' if in_class && chars.peek() == Some(&':') => {
                // POSIX class such as [:alpha:] inside a bracket expression.
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == ']' {
                        break;
                    }
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(c);
            }
            other => out.push(other),
        }
    }
    out
}

fn regex_of(e: &Expr, env: &mut Env) -> Result<Arc<Regex>, CelError> {
    if let Expr::Regex(re) = e {
        return re
            .get()
            .map(|r| Arc::new(r.clone()))
            .map_err(|err| CelError::Eval(format!("invalid regex {:?}: {err}", re.as_str())));
    }
    let pattern = as_str(&env.eval(e)?, "matches")?;
    re2(&pattern)
        .map(Arc::new)
        .map_err(|err| CelError::Eval(format!("invalid regex {pattern:?}: {err}")))
}

fn list(items: Vec<CelValue>) -> CelValue {
    CelValue::List(Arc::new(items), ListKind::Atomic)
}

fn string(s: impl Into<Arc<str>>) -> CelValue {
    CelValue::String(s.into())
}

impl Env {
    fn lookup(&self, name: &str) -> Result<CelValue, CelError> {
        self.vars
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| CelError::Eval(format!("no such attribute: {name}")))
    }

    fn eval_bool(&mut self, e: &Expr) -> Result<bool, CelError> {
        match self.eval(e)? {
            CelValue::Bool(b) => Ok(b),
            other => eval_err(format!(
                "no such overload: expected bool, got {}",
                other.type_name()
            )),
        }
    }

    fn eval(&mut self, e: &Expr) -> Result<CelValue, CelError> {
        match e {
            Expr::Lit(v) => Ok(v.clone()),
            Expr::Regex(re) => Ok(string(re.as_str())),
            Expr::Ident(name) => self.lookup(name),
            Expr::Select {
                operand,
                field,
                optional,
            } => {
                let base = self.eval(operand)?;
                select(base, field, *optional)
            }
            Expr::Has(operand, field) => match self.eval(operand)? {
                CelValue::Map(m) => Ok(CelValue::Bool(map_get(&m, field).is_some())),
                CelValue::Optional(None) => Ok(CelValue::Bool(false)),
                CelValue::Optional(Some(v)) => match *v {
                    CelValue::Map(m) => Ok(CelValue::Bool(map_get(&m, field).is_some())),
                    other => eval_err(format!(
                        "invalid type for field selection: {}",
                        other.type_name()
                    )),
                },
                other => eval_err(format!(
                    "invalid type for field selection: {}",
                    other.type_name()
                )),
            },
            Expr::Index {
                operand,
                index,
                optional,
            } => {
                let base = self.eval(operand)?;
                let index = self.eval(index)?;
                index_value(base, &index, *optional)
            }
            Expr::List(items) => Ok(list(
                items
                    .iter()
                    .map(|i| self.eval(i))
                    .collect::<Result<_, _>>()?,
            )),
            Expr::Map(entries) => {
                let mut out = BTreeMap::new();
                for (k, v) in entries {
                    let key = match self.eval(k)? {
                        CelValue::String(s) => s.to_string(),
                        other => {
                            return eval_err(format!(
                                "unsupported map key type {}",
                                other.type_name()
                            ));
                        }
                    };
                    let value = self.eval(v)?;
                    if out.insert(key.clone(), value).is_some() {
                        return eval_err(format!("Failed with repeated key: {key}"));
                    }
                }
                Ok(CelValue::Map(Arc::new(out)))
            }
            Expr::Not(e) => Ok(CelValue::Bool(!self.eval_bool(e)?)),
            Expr::Neg(e) => match self.eval(e)? {
                CelValue::Int(i) => i
                    .checked_neg()
                    .map(CelValue::Int)
                    .ok_or(CelError::Eval("integer overflow".into())),
                CelValue::Double(d) => Ok(CelValue::Double(-d)),
                other => eval_err(format!("no such overload: -{}", other.type_name())),
            },
            Expr::And(a, b) => {
                let left = self.eval_bool(a);
                if left == Ok(false) {
                    return Ok(CelValue::Bool(false));
                }
                let right = self.eval_bool(b);
                match (left, right) {
                    (_, Ok(false)) => Ok(CelValue::Bool(false)),
                    (Ok(true), Ok(true)) => Ok(CelValue::Bool(true)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    (Ok(false), _) => Ok(CelValue::Bool(false)),
                }
            }
            Expr::Or(a, b) => {
                let left = self.eval_bool(a);
                if left == Ok(true) {
                    return Ok(CelValue::Bool(true));
                }
                let right = self.eval_bool(b);
                match (left, right) {
                    (_, Ok(true)) => Ok(CelValue::Bool(true)),
                    (Ok(false), Ok(false)) => Ok(CelValue::Bool(false)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    (Ok(true), _) => Ok(CelValue::Bool(true)),
                }
            }
            Expr::Cond(c, t, f) => {
                if self.eval_bool(c)? {
                    self.eval(t)
                } else {
                    self.eval(f)
                }
            }
            Expr::Binary(op, a, b) => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                binary(*op, &a, &b)
            }
            Expr::Macro {
                kind,
                range,
                var,
                filter,
                body,
            } => self.eval_macro(*kind, range, var, filter.as_deref(), body),
            Expr::Call { target, name, args } => self.call(target.as_deref(), name, args),
        }
    }

    fn eval_macro(
        &mut self,
        kind: MacroKind,
        range: &Expr,
        var: &str,
        filter: Option<&Expr>,
        body: &Expr,
    ) -> Result<CelValue, CelError> {
        let items: Vec<CelValue> = match self.eval(range)? {
            CelValue::List(items, _) => items.as_ref().clone(),
            CelValue::Map(m) => m.keys().map(|k| string(k.as_str())).collect(),
            other => return eval_err(format!("cannot iterate over {}", other.type_name())),
        };
        let mut count = 0usize;
        let mut out = Vec::new();
        let mut deferred: Option<CelError> = None;
        for item in items {
            self.vars.push((var.to_string(), item.clone()));
            let result = (|| -> Result<Option<bool>, CelError> {
                match kind {
                    MacroKind::All | MacroKind::Exists | MacroKind::ExistsOne => {
                        Ok(Some(self.eval_bool(body)?))
                    }
                    MacroKind::Filter => {
                        if self.eval_bool(body)? {
                            out.push(item.clone());
                        }
                        Ok(None)
                    }
                    MacroKind::Map => {
                        let keep = match filter {
                            Some(f) => self.eval_bool(f)?,
                            None => true,
                        };
                        if keep {
                            out.push(self.eval(body)?);
                        }
                        Ok(None)
                    }
                }
            })();
            self.vars.pop();
            match (kind, result) {
                (MacroKind::All, Ok(Some(false))) => return Ok(CelValue::Bool(false)),
                (MacroKind::Exists, Ok(Some(true))) => return Ok(CelValue::Bool(true)),
                (MacroKind::ExistsOne, Ok(Some(true))) => count += 1,
                (MacroKind::All | MacroKind::Exists, Err(e)) => deferred = Some(e),
                (_, Err(e)) => return Err(e),
                _ => {}
            }
        }
        if let Some(e) = deferred {
            return Err(e);
        }
        Ok(match kind {
            MacroKind::All => CelValue::Bool(true),
            MacroKind::Exists => CelValue::Bool(false),
            MacroKind::ExistsOne => CelValue::Bool(count == 1),
            MacroKind::Map | MacroKind::Filter => list(out),
        })
    }

    fn call(
        &mut self,
        target: Option<&Expr>,
        name: &str,
        args: &[Expr],
    ) -> Result<CelValue, CelError> {
        if let Some(Expr::Ident(ns)) = target
            && ns == "optional"
        {
            return match (name, args) {
                ("none", []) => Ok(CelValue::Optional(None)),
                ("of", [a]) => Ok(CelValue::Optional(Some(Box::new(self.eval(a)?)))),
                ("ofNonZeroValue", [a]) => {
                    let v = self.eval(a)?;
                    Ok(CelValue::Optional(if is_zero(&v) {
                        None
                    } else {
                        Some(Box::new(v))
                    }))
                }
                _ => eval_err(format!("no such overload: optional.{name}")),
            };
        }
        // Functions with regex arguments keep the precompiled pattern.
        match (target, name, args) {
            (Some(t), "matches", [re]) => {
                let s = as_str(&self.eval(t)?, "matches")?;
                let re = regex_of(re, self)?;
                return Ok(CelValue::Bool(re.is_match(&s)));
            }
            (None, "matches", [s, re]) => {
                let s = as_str(&self.eval(s)?, "matches")?;
                let re = regex_of(re, self)?;
                return Ok(CelValue::Bool(re.is_match(&s)));
            }
            (Some(t), "find", [re]) => {
                let s = as_str(&self.eval(t)?, "find")?;
                let re = regex_of(re, self)?;
                return Ok(string(re.find(&s).map(|m| m.as_str()).unwrap_or("")));
            }
            (Some(t), "findAll", [re, rest @ ..]) => {
                let s = as_str(&self.eval(t)?, "findAll")?;
                let re = regex_of(re, self)?;
                let limit = match rest {
                    [n] => as_int(&self.eval(n)?, "findAll")?,
                    _ => -1,
                };
                let found = re.find_iter(&s).map(|m| string(m.as_str()));
                let found: Vec<CelValue> = if limit < 0 {
                    found.collect()
                } else {
                    found.take(limit as usize).collect()
                };
                return Ok(list(found));
            }
            _ => {}
        }
        let this = match target {
            Some(t) => Some(self.eval(t)?),
            None => None,
        };
        let args: Vec<CelValue> = args
            .iter()
            .map(|a| self.eval(a))
            .collect::<Result<_, _>>()?;
        match this {
            Some(this) => member_call(this, name, &args),
            None => global_call(name, &args),
        }
    }
}

fn is_zero(v: &CelValue) -> bool {
    match v {
        CelValue::Null => true,
        CelValue::Bool(b) => !b,
        CelValue::Int(i) => *i == 0,
        CelValue::Uint(u) => *u == 0,
        CelValue::Double(d) => *d == 0.0,
        CelValue::String(s) => s.is_empty(),
        CelValue::Bytes(b) => b.is_empty(),
        CelValue::List(l, _) => l.is_empty(),
        CelValue::Map(m) => m.is_empty(),
        _ => false,
    }
}

fn select(base: CelValue, field: &str, optional: bool) -> Result<CelValue, CelError> {
    match base {
        CelValue::Map(m) => match map_get(&m, field) {
            Some(v) if optional => Ok(CelValue::Optional(Some(Box::new(v.clone())))),
            Some(v) => Ok(v.clone()),
            None if optional => Ok(CelValue::Optional(None)),
            None => eval_err(format!("no such key: {field}")),
        },
        CelValue::Optional(None) => Ok(CelValue::Optional(None)),
        CelValue::Optional(Some(inner)) => match select(*inner, field, true)? {
            v @ CelValue::Optional(_) => Ok(v),
            v => Ok(CelValue::Optional(Some(Box::new(v)))),
        },
        other => eval_err(format!(
            "invalid type for field selection: {}",
            other.type_name()
        )),
    }
}

fn index_value(base: CelValue, index: &CelValue, optional: bool) -> Result<CelValue, CelError> {
    let wrap = |v: Option<CelValue>| -> Result<CelValue, CelError> {
        match (v, optional) {
            (Some(v), true) => Ok(CelValue::Optional(Some(Box::new(v)))),
            (Some(v), false) => Ok(v),
            (None, true) => Ok(CelValue::Optional(None)),
            (None, false) => eval_err(format!(
                "index out of range or no such key: {}",
                index.display()
            )),
        }
    };
    match base {
        CelValue::List(items, _) => {
            let i = match index {
                CelValue::Int(i) => *i,
                CelValue::Uint(u) => i64::try_from(*u).unwrap_or(i64::MAX),
                CelValue::Double(d) if d.fract() == 0.0 => *d as i64,
                other => return eval_err(format!("unsupported index type {}", other.type_name())),
            };
            wrap(usize::try_from(i).ok().and_then(|i| items.get(i)).cloned())
        }
        CelValue::Map(m) => match index {
            CelValue::String(k) => wrap(m.get(k.as_ref()).cloned()),
            other => wrap(m.get(&other.display()).cloned()),
        },
        CelValue::Optional(None) => Ok(CelValue::Optional(None)),
        CelValue::Optional(Some(inner)) => match index_value(*inner, index, true)? {
            v @ CelValue::Optional(_) => Ok(v),
            v => Ok(CelValue::Optional(Some(Box::new(v)))),
        },
        other => eval_err(format!(
            "no such overload: {}[{}]",
            other.type_name(),
            index.type_name()
        )),
    }
}

fn binary(op: BinOp, a: &CelValue, b: &CelValue) -> Result<CelValue, CelError> {
    use CelValue::*;
    use std::cmp::Ordering;
    let overload = || {
        CelError::Eval(format!(
            "no such overload: {} {op:?} {}",
            a.type_name(),
            b.type_name()
        ))
    };
    match op {
        BinOp::Eq => Ok(Bool(a.equals(b))),
        BinOp::Ne => Ok(Bool(!a.equals(b))),
        BinOp::In => match b {
            List(items, _) => Ok(Bool(items.iter().any(|i| i.equals(a)))),
            Map(m) => match a {
                String(k) => Ok(Bool(m.contains_key(k.as_ref()))),
                _ => Ok(Bool(false)),
            },
            _ => Err(overload()),
        },
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            let ord = match (a, b) {
                (String(x), String(y)) => Some(x.cmp(y)),
                (Bool(x), Bool(y)) => Some(x.cmp(y)),
                (Bytes(x), Bytes(y)) => Some(x.cmp(y)),
                (Duration(x), Duration(y)) => Some(x.cmp(y)),
                _ => numeric_cmp(a, b),
            };
            let Some(ord) = ord else {
                if matches!(a, Double(_)) || matches!(b, Double(_)) {
                    return Ok(Bool(false)); // NaN
                }
                return Err(overload());
            };
            Ok(Bool(match op {
                BinOp::Lt => ord == Ordering::Less,
                BinOp::Le => ord != Ordering::Greater,
                BinOp::Gt => ord == Ordering::Greater,
                _ => ord != Ordering::Less,
            }))
        }
        BinOp::Add => match (a, b) {
            (Int(x), Int(y)) => x
                .checked_add(*y)
                .map(Int)
                .ok_or(CelError::Eval("integer overflow".into())),
            (Uint(x), Uint(y)) => x
                .checked_add(*y)
                .map(Uint)
                .ok_or(CelError::Eval("unsigned integer overflow".into())),
            (Double(x), Double(y)) => Ok(Double(x + y)),
            (String(x), String(y)) => Ok(string(format!("{x}{y}"))),
            (Bytes(x), Bytes(y)) => Ok(Bytes([x.as_ref(), y.as_ref()].concat().into())),
            (List(x, _), List(y, _)) => Ok(list(x.iter().chain(y.iter()).cloned().collect())),
            (Duration(x), Duration(y)) => x
                .checked_add(*y)
                .map(Duration)
                .ok_or(CelError::Eval("duration overflow".into())),
            _ => Err(overload()),
        },
        BinOp::Sub => match (a, b) {
            (Int(x), Int(y)) => x
                .checked_sub(*y)
                .map(Int)
                .ok_or(CelError::Eval("integer overflow".into())),
            (Uint(x), Uint(y)) => x
                .checked_sub(*y)
                .map(Uint)
                .ok_or(CelError::Eval("unsigned integer overflow".into())),
            (Double(x), Double(y)) => Ok(Double(x - y)),
            (Duration(x), Duration(y)) => x
                .checked_sub(*y)
                .map(Duration)
                .ok_or(CelError::Eval("duration overflow".into())),
            _ => Err(overload()),
        },
        BinOp::Mul => match (a, b) {
            (Int(x), Int(y)) => x
                .checked_mul(*y)
                .map(Int)
                .ok_or(CelError::Eval("integer overflow".into())),
            (Uint(x), Uint(y)) => x
                .checked_mul(*y)
                .map(Uint)
                .ok_or(CelError::Eval("unsigned integer overflow".into())),
            (Double(x), Double(y)) => Ok(Double(x * y)),
            _ => Err(overload()),
        },
        BinOp::Div => match (a, b) {
            (Int(_), Int(0)) | (Uint(_), Uint(0)) => eval_err("division by zero"),
            (Int(x), Int(y)) => x
                .checked_div(*y)
                .map(Int)
                .ok_or(CelError::Eval("integer overflow".into())),
            (Uint(x), Uint(y)) => Ok(Uint(x / y)),
            (Double(x), Double(y)) => Ok(Double(x / y)),
            _ => Err(overload()),
        },
        BinOp::Rem => match (a, b) {
            (Int(_), Int(0)) | (Uint(_), Uint(0)) => eval_err("modulus by zero"),
            (Int(x), Int(y)) => x
                .checked_rem(*y)
                .map(Int)
                .ok_or(CelError::Eval("integer overflow".into())),
            (Uint(x), Uint(y)) => Ok(Uint(x % y)),
            _ => Err(overload()),
        },
    }
}

fn size_of(v: &CelValue) -> Result<CelValue, CelError> {
    match v {
        CelValue::String(s) => Ok(CelValue::Int(s.chars().count() as i64)),
        CelValue::Bytes(b) => Ok(CelValue::Int(b.len() as i64)),
        CelValue::List(l, _) => Ok(CelValue::Int(l.len() as i64)),
        CelValue::Map(m) => Ok(CelValue::Int(m.len() as i64)),
        other => eval_err(format!("no such overload: size({})", other.type_name())),
    }
}

fn global_call(name: &str, args: &[CelValue]) -> Result<CelValue, CelError> {
    use CelValue::*;
    let overload = || {
        CelError::Eval(format!(
            "no such overload: {name}({})",
            args.iter()
                .map(CelValue::type_name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    match (name, args) {
        ("size", [v]) => size_of(v),
        ("dyn", [v]) => Ok(v.clone()),
        ("type", [v]) => Ok(Type(v.type_name())),
        ("int", [v]) => match v {
            Int(i) => Ok(Int(*i)),
            Uint(u) => i64::try_from(*u)
                .map(Int)
                .map_err(|_| CelError::Eval("range error converting uint to int".into())),
            Double(d) if d.is_finite() && *d >= i64::MIN as f64 && *d < i64::MAX as f64 => {
                Ok(Int(*d as i64))
            }
            Double(_) => eval_err("range error converting double to int"),
            String(s) => s
                .parse()
                .map(Int)
                .map_err(|_| CelError::Eval(format!("cannot convert {s:?} to int"))),
            Bool(b) => Ok(Int(i64::from(*b))),
            Duration(n) => Ok(Int(n / 1_000_000_000)),
            _ => Err(overload()),
        },
        ("uint", [v]) => match v {
            Int(i) => u64::try_from(*i)
                .map(Uint)
                .map_err(|_| CelError::Eval("range error converting int to uint".into())),
            Uint(u) => Ok(Uint(*u)),
            Double(d) if d.is_finite() && *d >= 0.0 && *d < 1.8446744073709552e19 => {
                Ok(Uint(*d as u64))
            }
            String(s) => s
                .parse()
                .map(Uint)
                .map_err(|_| CelError::Eval(format!("cannot convert {s:?} to uint"))),
            _ => Err(overload()),
        },
        ("double", [v]) => match v {
            Int(i) => Ok(Double(*i as f64)),
            Uint(u) => Ok(Double(*u as f64)),
            Double(d) => Ok(Double(*d)),
            String(s) => s
                .parse()
                .map(Double)
                .map_err(|_| CelError::Eval(format!("cannot convert {s:?} to double"))),
            _ => Err(overload()),
        },
        ("string", [v]) => match v {
            String(_) | Int(_) | Uint(_) | Double(_) | Bool(_) | Duration(_) | Ip(_) | Cidr(..) => {
                Ok(string(v.display()))
            }
            Bytes(b) => std::str::from_utf8(b)
                .map(string)
                .map_err(|_| CelError::Eval("invalid UTF-8 in bytes".into())),
            _ => Err(overload()),
        },
        ("bool", [v]) => match v {
            Bool(b) => Ok(Bool(*b)),
            String(s) => match s.as_ref() {
                "true" | "True" | "TRUE" | "t" | "1" => Ok(Bool(true)),
                "false" | "False" | "FALSE" | "f" | "0" => Ok(Bool(false)),
                _ => eval_err(format!("cannot convert {s:?} to bool")),
            },
            _ => Err(overload()),
        },
        ("bytes", [String(s)]) => Ok(Bytes(s.as_bytes().into())),
        ("isURL", [String(s)]) => Ok(Bool(parse_url(s).is_some())),
        ("url", [String(s)]) => parse_url(s).map(|u| Url(Arc::new(u))).ok_or_else(|| {
            CelError::Eval(format!(
                "URL parse error during conversion from string: {s}"
            ))
        }),
        ("isIP", [String(s)]) => Ok(Bool(parse_ip(s).is_some())),
        ("ip", [String(s)]) => parse_ip(s).map(Ip).ok_or_else(|| {
            CelError::Eval(format!(
                "IP Address {s:?} parse error during conversion from string"
            ))
        }),
        ("isCIDR", [String(s)]) => Ok(Bool(parse_cidr(s).is_some())),
        ("cidr", [String(s)]) => parse_cidr(s).map(|(ip, p)| Cidr(ip, p)).ok_or_else(|| {
            CelError::Eval(format!(
                "network address parse error during conversion from string: {s}"
            ))
        }),
        ("duration", [String(s)]) => parse_duration(s)
            .map(Duration)
            .ok_or_else(|| CelError::Eval(format!("cannot parse duration {s:?}"))),
        _ => Err(overload()),
    }
}

fn member_call(this: CelValue, name: &str, args: &[CelValue]) -> Result<CelValue, CelError> {
    use CelValue::*;
    let overload = || {
        CelError::Eval(format!(
            "no such overload: {}.{name}({})",
            this.type_name(),
            args.iter()
                .map(CelValue::type_name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    match (&this, name, args) {
        (_, "size", []) => size_of(&this),
        (String(s), "startsWith", [String(p)]) => Ok(Bool(s.starts_with(p.as_ref()))),
        (String(s), "endsWith", [String(p)]) => Ok(Bool(s.ends_with(p.as_ref()))),
        (String(s), "contains", [String(p)]) => Ok(Bool(s.contains(p.as_ref()))),
        (String(s), "lowerAscii", []) => Ok(string(s.to_ascii_lowercase())),
        (String(s), "upperAscii", []) => Ok(string(s.to_ascii_uppercase())),
        (String(s), "trim", []) => Ok(string(s.trim())),
        (String(s), "split", [String(sep), rest @ ..]) => {
            let limit = match rest {
                [] => -1,
                [Int(n)] => *n,
                _ => return Err(overload()),
            };
            let parts: Vec<CelValue> = match limit {
                0 => Vec::new(),
                n if n < 0 => split_all(s, sep),
                n => {
                    if sep.is_empty() {
                        let mut chars: Vec<CelValue> = Vec::new();
                        let all: Vec<char> = s.chars().collect();
                        let n = n as usize;
                        for (i, c) in all.iter().enumerate() {
                            if i + 1 == n {
                                chars
                                    .push(string(all[i..].iter().collect::<std::string::String>()));
                                break;
                            }
                            chars.push(string(c.to_string()));
                        }
                        chars
                    } else {
                        s.splitn(n as usize, sep.as_ref()).map(string).collect()
                    }
                }
            };
            Ok(list(parts))
        }
        (String(s), "indexOf", [String(p), rest @ ..]) => {
            let chars: Vec<char> = s.chars().collect();
            let start = match rest {
                [] => 0,
                [Int(n)] if *n >= 0 && (*n as usize) <= chars.len() => *n as usize,
                [Int(n)] => return eval_err(format!("index out of range: {n}")),
                _ => return Err(overload()),
            };
            let hay: std::string::String = chars[start..].iter().collect();
            Ok(Int(hay
                .find(p.as_ref())
                .map(|b| (start + hay[..b].chars().count()) as i64)
                .unwrap_or(-1)))
        }
        (String(s), "lastIndexOf", [String(p)]) => Ok(Int(s
            .rfind(p.as_ref())
            .map(|b| s[..b].chars().count() as i64)
            .unwrap_or(-1))),
        (String(s), "replace", [String(from), String(to)]) => {
            Ok(string(s.replace(from.as_ref(), to)))
        }
        (String(s), "substring", [Int(a), rest @ ..]) => {
            let chars: Vec<char> = s.chars().collect();
            let end = match rest {
                [] => chars.len() as i64,
                [Int(b)] => *b,
                _ => return Err(overload()),
            };
            if *a < 0 || end < *a || end as usize > chars.len() {
                return eval_err(format!("index out of range: {a}, {end}"));
            }
            Ok(string(
                chars[*a as usize..end as usize]
                    .iter()
                    .collect::<std::string::String>(),
            ))
        }
        (String(s), "charAt", [Int(i)]) => {
            let chars: Vec<char> = s.chars().collect();
            match usize::try_from(*i) {
                Ok(i) if i < chars.len() => Ok(string(chars[i].to_string())),
                Ok(i) if i == chars.len() => Ok(string("")),
                _ => eval_err(format!("index out of range: {i}")),
            }
        }
        (List(items, _), "join", rest) => {
            let sep = match rest {
                [] => "".into(),
                [String(s)] => s.clone(),
                _ => return Err(overload()),
            };
            let parts: Result<Vec<Arc<str>>, CelError> =
                items.iter().map(|i| as_str(i, "join")).collect();
            Ok(string(
                parts?
                    .iter()
                    .map(|p| p.as_ref())
                    .collect::<Vec<_>>()
                    .join(&sep),
            ))
        }
        (List(items, _), "isSorted", []) => {
            for w in items.windows(2) {
                if matches!(binary(BinOp::Gt, &w[0], &w[1])?, Bool(true)) {
                    return Ok(Bool(false));
                }
            }
            Ok(Bool(true))
        }
        (List(items, _), "sum", []) => {
            let mut acc = Int(0);
            for (i, item) in items.iter().enumerate() {
                acc = if i == 0 {
                    item.clone()
                } else {
                    binary(BinOp::Add, &acc, item)?
                };
            }
            Ok(acc)
        }
        (List(items, _), "min" | "max", []) => {
            let want = if name == "min" { BinOp::Lt } else { BinOp::Gt };
            let mut best: Option<CelValue> = None;
            for item in items.iter() {
                best = match best {
                    None => Some(item.clone()),
                    Some(b) => Some(if matches!(binary(want, item, &b)?, Bool(true)) {
                        item.clone()
                    } else {
                        b
                    }),
                };
            }
            best.ok_or_else(|| CelError::Eval(format!("{name} called on empty list")))
        }
        (Optional(o), "orValue", [d]) => Ok(o.as_deref().cloned().unwrap_or_else(|| d.clone())),
        (Optional(o), "hasValue", []) => Ok(Bool(o.is_some())),
        (Optional(o), "value", []) => o
            .as_deref()
            .cloned()
            .ok_or(CelError::Eval("optional.none() dereference".into())),
        (Url(u), "getScheme", []) => Ok(string(u.scheme.as_str())),
        (Url(u), "getHost", []) => Ok(string(if u.port.is_empty() {
            u.host.clone()
        } else {
            format!("{}:{}", u.host, u.port)
        })),
        (Url(u), "getHostname", []) => {
            Ok(string(u.host.trim_start_matches('[').trim_end_matches(']')))
        }
        (Url(u), "getPort", []) => Ok(string(u.port.as_str())),
        (Url(u), "getEscapedPath", []) => Ok(string(u.path.as_str())),
        (Url(u), "getQuery", []) => {
            let mut out: BTreeMap<std::string::String, Vec<CelValue>> = BTreeMap::new();
            for pair in u.query.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                out.entry(k.to_string()).or_default().push(string(v));
            }
            Ok(Map(Arc::new(
                out.into_iter().map(|(k, v)| (k, list(v))).collect(),
            )))
        }
        (Ip(ip), "family", []) => Ok(Int(if ip.is_ipv4() { 4 } else { 6 })),
        (Ip(ip), "isUnspecified", []) => Ok(Bool(ip.is_unspecified())),
        (Ip(ip), "isLoopback", []) => Ok(Bool(ip.is_loopback())),
        (Cidr(ip, _), "ip", []) => Ok(Ip(*ip)),
        (Cidr(_, p), "prefixLength", []) => Ok(Int(i64::from(*p))),
        (Cidr(ip, p), "masked", []) => Ok(Cidr(mask(*ip, *p), *p)),
        (Cidr(net, p), "containsIP", [other]) => {
            let ip = match other {
                Ip(ip) => *ip,
                String(s) => parse_ip(s).ok_or_else(overload)?,
                _ => return Err(overload()),
            };
            Ok(Bool(
                net.is_ipv4() == ip.is_ipv4() && mask(ip, *p) == mask(*net, *p),
            ))
        }
        (Cidr(net, p), "containsCIDR", [other]) => {
            let (ip, q) = match other {
                Cidr(ip, q) => (*ip, *q),
                String(s) => parse_cidr(s).ok_or_else(overload)?,
                _ => return Err(overload()),
            };
            Ok(Bool(
                net.is_ipv4() == ip.is_ipv4() && q >= *p && mask(ip, *p) == mask(*net, *p),
            ))
        }
        (Duration(n), "getSeconds", []) => Ok(Int(n / 1_000_000_000)),
        (Duration(n), "getMilliseconds", []) => Ok(Int(n / 1_000_000)),
        (Duration(n), "getMinutes", []) => Ok(Int(n / 60_000_000_000)),
        (Duration(n), "getHours", []) => Ok(Int(n / 3_600_000_000_000)),
        _ => Err(overload()),
    }
}

fn split_all(s: &str, sep: &str) -> Vec<CelValue> {
    if sep.is_empty() {
        return s.chars().map(|c| string(c.to_string())).collect();
    }
    s.split(sep).map(string).collect()
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix.min(32)))
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix.min(128)))
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

/// Kubernetes' `isIP` rejects IPv4-mapped IPv6 and zones; Rust's parser
/// already rejects zones and leading zeros in IPv4.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = s.parse().ok()?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
        && s.contains('.')
    {
        return None;
    }
    Some(ip)
}

fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, prefix) = s.split_once('/')?;
    let ip = parse_ip(ip)?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((ip, prefix))
}

/// Go `url.Parse` as Kubernetes' `isURL` uses it: an absolute URL with a
/// scheme, or an absolute path.
fn parse_url(s: &str) -> Option<Url> {
    if s.is_empty() || s.chars().any(|c| c.is_control() || c == ' ') {
        return None;
    }
    let (rest, _fragment) = s.split_once('#').unwrap_or((s, ""));
    let (scheme, rest) = match rest.split_once(':') {
        Some((scheme, rest))
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            (scheme.to_ascii_lowercase(), rest)
        }
        _ => {
            if !rest.starts_with('/') {
                return None;
            }
            (std::string::String::new(), rest)
        }
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.strip_prefix("//") {
        Some(after) => match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, ""),
        },
        None => ("", rest),
    };
    let hostport = authority
        .rsplit_once('@')
        .map(|(_, h)| h)
        .unwrap_or(authority);
    let (host, port) = if let Some(inner) = hostport.strip_prefix('[') {
        let (h, after) = inner.split_once(']')?;
        let port = after.strip_prefix(':').unwrap_or("");
        (format!("[{h}]"), port.to_string())
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.to_string()),
            None => (hostport.to_string(), std::string::String::new()),
        }
    };
    if !port.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(Url {
        scheme,
        host,
        port,
        path: path.to_string(),
        query: query.to_string(),
    })
}

/// Go `time.ParseDuration` syntax (`1h30m`, `300ms`, `-1.5h`), in nanoseconds.
fn parse_duration(s: &str) -> Option<i64> {
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let number: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * factor;
    }
    if total > i64::MAX as f64 {
        return None;
    }
    Some(if negative {
        -(total as i64)
    } else {
        total as i64
    })
}

// ---------------------------------------------------------------------------
// x-kubernetes-validations
// ---------------------------------------------------------------------------

/// One compiled `x-kubernetes-validations` entry.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule's source text.
    pub rule: String,
    program: Program,
    /// `message`, if given.
    pub message: Option<String>,
    message_expression: Option<Program>,
    /// `reason` (`FieldValueInvalid` when absent).
    pub reason: Option<String>,
    /// `fieldPath` relative to the schema node, e.g. `.spec.foo`.
    pub field_path: Option<String>,
    /// `optionalOldSelf`.
    pub optional_old_self: bool,
}

/// What a rule evaluation decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The rule holds (or did not apply).
    Pass,
    /// The rule failed; the message to report.
    Fail(String),
    /// The rule could not be evaluated; the error text to report.
    Error(String),
}

impl Rule {
    /// Compile one entry of `x-kubernetes-validations`.
    pub fn compile(entry: &Value) -> Result<Rule, CelError> {
        let rule = entry
            .get("rule")
            .and_then(Value::as_str)
            .ok_or_else(|| CelError::Rule("missing \"rule\"".into()))?
            .to_string();
        let program = Program::compile(&rule)?;
        let message_expression = match entry.get("messageExpression").and_then(Value::as_str) {
            Some(src) => Some(Program::compile(src)?),
            None => None,
        };
        Ok(Rule {
            program,
            message: entry
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string),
            message_expression,
            reason: entry
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_string),
            field_path: entry
                .get("fieldPath")
                .and_then(Value::as_str)
                .map(str::to_string),
            optional_old_self: entry
                .get("optionalOldSelf")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            rule,
        })
    }

    /// A transition rule mentions `oldSelf`.
    pub fn is_transition(&self) -> bool {
        self.program.uses_old_self()
    }

    /// Evaluate against `self` and the correlated old value (None on create
    /// or when there is nothing to correlate). Transition rules without an
    /// old value pass, unless `optionalOldSelf` (then `oldSelf` is an
    /// optional).
    pub fn evaluate(&self, this: &CelValue, old: Option<&CelValue>) -> Verdict {
        let old_binding = match (self.is_transition(), self.optional_old_self, old) {
            (false, _, _) => None,
            (true, true, o) => Some(CelValue::Optional(o.map(|v| Box::new(v.clone())))),
            (true, false, Some(o)) => Some(o.clone()),
            (true, false, None) => return Verdict::Pass,
        };
        match self.program.eval(this, old_binding.as_ref()) {
            Ok(CelValue::Bool(true)) => Verdict::Pass,
            Ok(CelValue::Bool(false)) => {
                Verdict::Fail(self.failure_message(this, old_binding.as_ref()))
            }
            Ok(other) => Verdict::Error(format!(
                "validation failed due to non-bool result type {}",
                other.type_name()
            )),
            Err(e) => Verdict::Error(format!("{e}")),
        }
    }

    fn failure_message(&self, this: &CelValue, old: Option<&CelValue>) -> String {
        if let Some(expr) = &self.message_expression
            && let Ok(CelValue::String(s)) = expr.eval(this, old)
            && !s.trim().is_empty()
            && !s.contains('\n')
        {
            return s.to_string();
        }
        match &self.message {
            Some(m) if !m.is_empty() => m.clone(),
            _ => format!("failed rule: {}", self.rule),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(src: &str, this: Value) -> Result<CelValue, CelError> {
        Program::compile(src)?.eval(&CelValue::from_json(&this), None)
    }

    fn truth(src: &str, this: Value) -> bool {
        match eval(src, this) {
            Ok(CelValue::Bool(b)) => b,
            other => panic!("{src}: {other:?}"),
        }
    }

    #[test]
    fn literals_operators_and_precedence() {
        assert!(truth("1 + 2 * 3 == 7 && (1 + 2) * 3 == 9", json!(null)));
        assert!(truth(
            "-5 % 3 == -2 && 7 / 2 == 3 && 7.0 / 2.0 == 3.5",
            json!(null)
        ));
        assert!(truth(
            "'a' + \"b\" == 'ab' && 'abc' < 'abd' && 1 < 1.5 && 2u > 1",
            json!(null)
        ));
        assert!(truth(
            "(true ? (false ? 1 : 2) : 3) == 2 && (false ? 1 : true ? 2 : 3) == 2",
            json!(null)
        ));
        // The middle operand of ?: is a conditional-or, as in cel-go's grammar.
        assert!(matches!(
            Program::compile("true ? false ? 1 : 2 : 3"),
            Err(CelError::Syntax { .. })
        ));
        assert!(truth("!false && !!true || false", json!(null)));
        assert!(truth(
            "[1, 2] + [3] == [1, 2, 3] && {'a': 1}.a == 1 && 0x10 == 16",
            json!(null)
        ));
        assert!(truth(
            r"'\\d' == '\x5cd' && r'\d' == '\\d' && '''x''' == 'x'",
            json!(null)
        ));
        assert!(matches!(
            eval("1 + 'a'", json!(null)),
            Err(CelError::Eval(_))
        ));
        assert!(matches!(
            eval("9223372036854775807 + 1", json!(null)),
            Err(CelError::Eval(_))
        ));
    }

    #[test]
    fn fields_has_optional_and_errors() {
        let obj = json!({"a": {"b": 1}, "x-y": 2, "list": [1, 2, 3]});
        assert!(truth(
            "has(self.a) && has(self.a.b) && !has(self.c)",
            obj.clone()
        ));
        assert!(truth("self.x__dash__y == 2", obj.clone()));
        assert!(truth(
            "self.?c.d.orValue(5) == 5 && self.?a.b.orValue(0) == 1 && !self.?c.hasValue()",
            obj.clone()
        ));
        assert!(truth(
            "self.list[?7].orValue(0) == 0 && 2 in self.list && 'a' in self",
            obj.clone()
        ));
        let err = eval("self.c == 1", obj.clone()).expect_err("no such key");
        assert_eq!(err, CelError::Eval("no such key: c".into()));
        // Errors are absorbed by short-circuiting in either order.
        assert!(truth("self.c == 1 || true", obj.clone()));
        assert!(truth("!(self.c == 1 && false)", obj));
    }

    #[test]
    fn macros() {
        let obj = json!({"l": [1, 2, 3], "names": ["a", "b", "a"]});
        assert!(truth(
            "self.l.all(x, x > 0) && self.l.exists(x, x == 2) && self.l.exists_one(x, x == 3)",
            obj.clone()
        ));
        assert!(truth("!self.names.exists_one(n, n == 'a')", obj.clone()));
        assert!(truth(
            "self.l.map(x, x * 2) == [2, 4, 6] && self.l.filter(x, x % 2 == 1) == [1, 3]",
            obj.clone()
        ));
        assert!(truth("self.l.map(x, x > 1, x) == [2, 3]", obj.clone()));
        assert!(truth(
            "self.names.all(x, self.names.exists(y, x == y)) && {'k': 1}.all(k, k == 'k')",
            obj
        ));
    }

    #[test]
    fn string_library() {
        let s = json!("arn:aws:iam::123:role/x");
        assert!(truth(
            "self.startsWith('arn:') && self.endsWith('/x') && self.contains('iam')",
            s.clone()
        ));
        assert!(truth(
            "self.split(':').size() == 6 && self.split(':')[4] == '123'",
            s.clone()
        ));
        assert!(truth(
            "size(self) == 23 && self.size() == 23 && self.lowerAscii() == self",
            s.clone()
        ));
        assert!(truth(
            "self.matches('^arn:') && !self.matches('^x') && self.find('[0-9]+') == '123'",
            s.clone()
        ));
        assert!(truth(
            "int(self.split(':')[4]) == 123 && string(5) == '5' && double(1) == 1.0",
            s.clone()
        ));
        assert!(truth(
            "'a,b'.split(',', 1) == ['a,b'] && ['a', 'b'].join('-') == 'a-b'",
            s.clone()
        ));
        assert!(truth(
            "'٣'.matches('^\\\\d$') == false && '3'.matches('^\\\\d$') && 'é'.matches('^[\\\\w]$') == false",
            json!(null)
        ));
        assert!(truth(
            "'hello'.indexOf('l') == 2 && 'hello'.substring(1, 3) == 'el' && ' x '.trim() == 'x'",
            s
        ));
    }

    #[test]
    fn kubernetes_libraries() {
        let s = json!("https://example.com:8443/p?a=1");
        assert!(truth(
            "isURL(self) && url(self).getScheme() == 'https' && url(self).getHost() == 'example.com:8443'",
            s.clone()
        ));
        assert!(truth(
            "url(self).getQuery() == {'a': ['1']} && url('https://x/').getQuery() == {}",
            s
        ));
        assert!(truth(
            "!isURL('not a url') && isURL('/abs/path')",
            json!(null)
        ));
        assert!(truth(
            "isCIDR('10.0.0.0/16') && cidr('10.0.0.0/16').ip().family() == 4 && cidr('fd00::/48').prefixLength() == 48",
            json!(null)
        ));
        assert!(truth(
            "!isCIDR('10.0.0.0/33') && isIP('::1') && !isIP('10.0.0.256')",
            json!(null)
        ));
        assert!(truth(
            "cidr('10.0.0.0/8').containsIP('10.1.2.3') && !cidr('10.0.0.0/8').containsIP('11.0.0.1')",
            json!(null)
        ));
        assert!(truth(
            "duration('1h30m').getSeconds() == 5400 && duration('300ms') < duration('1s')",
            json!(null)
        ));
    }

    #[test]
    fn set_lists_compare_without_order() {
        let a = CelValue::List(
            Arc::new(vec![CelValue::Int(1), CelValue::Int(2)]),
            ListKind::Set,
        );
        let b = CelValue::List(
            Arc::new(vec![CelValue::Int(2), CelValue::Int(1)]),
            ListKind::Set,
        );
        assert!(a.equals(&b));
        let c = CelValue::List(
            Arc::new(vec![CelValue::Int(2), CelValue::Int(1)]),
            ListKind::Atomic,
        );
        assert!(!c.equals(&CelValue::List(
            Arc::new(vec![CelValue::Int(1), CelValue::Int(2)]),
            ListKind::Atomic
        )));
    }

    #[test]
    fn unknown_functions_and_variables_do_not_compile() {
        assert_eq!(
            Program::compile("self.frobnicate()")
                .expect_err("unknown")
                .to_string(),
            "undeclared reference to 'frobnicate'"
        );
        assert!(matches!(
            Program::compile("request.auth == 1"),
            Err(CelError::Undeclared(_))
        ));
        assert!(matches!(
            Program::compile("self.matches('(')"),
            Err(CelError::Regex { .. })
        ));
        assert!(matches!(
            Program::compile("self =="),
            Err(CelError::Syntax { .. })
        ));
        assert!(matches!(
            Program::compile("has(self)"),
            Err(CelError::Syntax { .. })
        ));
    }

    #[test]
    fn rules_transition_and_messages() {
        let immutable =
            Rule::compile(&json!({"rule": "self == oldSelf", "message": "x is immutable"}))
                .expect("rule");
        assert!(immutable.is_transition());
        let a = CelValue::from_json(&json!("a"));
        let b = CelValue::from_json(&json!("b"));
        assert_eq!(immutable.evaluate(&a, None), Verdict::Pass);
        assert_eq!(immutable.evaluate(&a, Some(&a)), Verdict::Pass);
        assert_eq!(
            immutable.evaluate(&a, Some(&b)),
            Verdict::Fail("x is immutable".into())
        );
        let expr = Rule::compile(&json!({"rule": "self.size() < 1", "messageExpression": "'too long: ' + string(self.size())"}))
            .expect("rule");
        assert_eq!(expr.evaluate(&a, None), Verdict::Fail("too long: 1".into()));
        let plain = Rule::compile(&json!({"rule": "self == 'b'"})).expect("rule");
        assert_eq!(
            plain.evaluate(&a, None),
            Verdict::Fail("failed rule: self == 'b'".into())
        );
        let optional = Rule::compile(&json!({"rule": "!oldSelf.hasValue() || self == oldSelf.value()", "optionalOldSelf": true}))
            .expect("rule");
        assert_eq!(optional.evaluate(&a, None), Verdict::Pass);
        assert!(matches!(optional.evaluate(&a, Some(&b)), Verdict::Fail(_)));
        let erroring = Rule::compile(&json!({"rule": "self.missing == 1"})).expect("rule");
        assert!(matches!(
            erroring.evaluate(&CelValue::from_json(&json!({})), None),
            Verdict::Error(_)
        ));
    }
}
