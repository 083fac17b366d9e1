//! The lexer: source text to tokens, applying the newline rules of section 1.
//!
//! A newline becomes a `Newline` token only where it can end a statement: not directly inside
//! `(` or `[`, and not after a token that cannot end an expression. (The "newline before
//! `else`" rule is the parser's: it looks past newlines for an `else`.)

use crate::diag::Diags;
use zygvm_vm::program::Span;

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Int(i64),
    Float(f64),
    Str(String),
    Ident(String),
    // keywords
    Fn,
    Let,
    If,
    Else,
    While,
    For,
    In,
    Return,
    Break,
    Continue,
    True,
    False,
    Nil,
    Struct,
    And,
    Or,
    Not,
    Import,
    // punctuation
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Semi,
    Dot,
    DotDot,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Caret,
    At,
    Assign,
    PlusAssign,
    MinusAssign,
    StarAssign,
    SlashAssign,
    EqEq,
    NotEq,
    Lt,
    Le,
    Gt,
    Ge,
    Newline,
    Eof,
    /// A name or string the parser has already moved out of the token list.
    Taken,
}

impl Tok {
    /// Whether a newline right after this token is ignored (it cannot end an expression).
    fn continues_line(&self) -> bool {
        use Tok::*;
        matches!(
            self,
            Plus | Minus | Star | Slash | Percent | Caret | At | EqEq | NotEq | Lt | Le | Gt | Ge
                | And | Or | Not | Comma | Assign | PlusAssign | MinusAssign | StarAssign
                | SlashAssign | Dot | DotDot | LParen | LBracket | LBrace
        )
    }

    /// How the token is shown in a diagnostic.
    pub fn describe(&self) -> String {
        use Tok::*;
        match self {
            Int(i) => format!("integer {i}"),
            Float(x) => format!("float {x:?}"),
            Str(_) => "string literal".into(),
            Ident(n) => format!("name '{n}'"),
            Newline => "end of line".into(),
            Eof => "end of file".into(),
            other => format!("'{}'", other.text()),
        }
    }

    fn text(&self) -> &'static str {
        use Tok::*;
        match self {
            Fn => "fn",
            Let => "let",
            If => "if",
            Else => "else",
            While => "while",
            For => "for",
            In => "in",
            Return => "return",
            Break => "break",
            Continue => "continue",
            True => "true",
            False => "false",
            Nil => "nil",
            Struct => "struct",
            And => "and",
            Or => "or",
            Not => "not",
            Import => "import",
            LParen => "(",
            RParen => ")",
            LBracket => "[",
            RBracket => "]",
            LBrace => "{",
            RBrace => "}",
            Comma => ",",
            Semi => ";",
            Dot => ".",
            DotDot => "..",
            Plus => "+",
            Minus => "-",
            Star => "*",
            Slash => "/",
            Percent => "%",
            Caret => "^",
            At => "@",
            Assign => "=",
            PlusAssign => "+=",
            MinusAssign => "-=",
            StarAssign => "*=",
            SlashAssign => "/=",
            EqEq => "==",
            NotEq => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            _ => "?",
        }
    }
}

fn keyword(s: &str) -> Option<Tok> {
    use Tok::*;
    Some(match s {
        "fn" => Fn,
        "let" => Let,
        "if" => If,
        "else" => Else,
        "while" => While,
        "for" => For,
        "in" => In,
        "return" => Return,
        "break" => Break,
        "continue" => Continue,
        "true" => True,
        "false" => False,
        "nil" => Nil,
        "struct" => Struct,
        "and" => And,
        "or" => Or,
        "not" => Not,
        "import" => Import,
        _ => return None,
    })
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

struct Lexer<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    file: u32,
    out: Vec<Token>,
    brackets: Vec<u8>,
    diags: &'a mut Diags,
}

/// Splits `src` into tokens; errors are added to `diags` and lexing goes on after them.
pub fn lex(src: &str, file: u32, diags: &mut Diags) -> Vec<Token> {
    let mut lx = Lexer { src, bytes: src.as_bytes(), pos: 0, file, out: vec![], brackets: vec![], diags };
    lx.run();
    lx.out
}

impl<'a> Lexer<'a> {
    fn span(&self, lo: usize) -> Span {
        Span::new(self.file, lo, self.pos)
    }

    fn push(&mut self, tok: Tok, lo: usize) {
        let span = self.span(lo);
        self.out.push(Token { tok, span });
    }

    fn peek(&self, k: usize) -> u8 {
        *self.bytes.get(self.pos + k).unwrap_or(&0)
    }

    fn newline(&mut self, lo: usize) {
        if matches!(self.brackets.last(), Some(b'(') | Some(b'[')) {
            return;
        }
        match self.out.last() {
            None => {}
            Some(t) if t.tok == Tok::Newline || t.tok == Tok::Semi || t.tok.continues_line() => {}
            Some(_) => self.push(Tok::Newline, lo),
        }
    }

    fn run(&mut self) {
        while self.pos < self.bytes.len() {
            let lo = self.pos;
            let c = self.bytes[self.pos];
            match c {
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'\n' => {
                    self.pos += 1;
                    self.newline(lo);
                }
                b'#' => {
                    while self.pos < self.bytes.len() && self.bytes[self.pos] != b'\n' {
                        self.pos += 1;
                    }
                }
                b'0'..=b'9' => self.number(),
                b'"' => self.string(),
                c if c.is_ascii_alphabetic() || c == b'_' => {
                    while self.peek(0).is_ascii_alphanumeric() || self.peek(0) == b'_' {
                        self.pos += 1;
                    }
                    let word = &self.src[lo..self.pos];
                    let tok = keyword(word).unwrap_or_else(|| Tok::Ident(word.to_string()));
                    self.push(tok, lo);
                }
                _ => self.punct(lo),
            }
        }
        let end = self.bytes.len();
        self.newline(end);
        self.out.push(Token { tok: Tok::Eof, span: Span::new(self.file, end, end) });
    }

    fn punct(&mut self, lo: usize) {
        let (c, n) = (self.peek(0), self.peek(1));
        let (tok, len) = match (c, n) {
            (b'.', b'.') => (Tok::DotDot, 2),
            (b'=', b'=') => (Tok::EqEq, 2),
            (b'!', b'=') => (Tok::NotEq, 2),
            (b'<', b'=') => (Tok::Le, 2),
            (b'>', b'=') => (Tok::Ge, 2),
            (b'+', b'=') => (Tok::PlusAssign, 2),
            (b'-', b'=') => (Tok::MinusAssign, 2),
            (b'*', b'=') => (Tok::StarAssign, 2),
            (b'/', b'=') => (Tok::SlashAssign, 2),
            (b'(', _) => (Tok::LParen, 1),
            (b')', _) => (Tok::RParen, 1),
            (b'[', _) => (Tok::LBracket, 1),
            (b']', _) => (Tok::RBracket, 1),
            (b'{', _) => (Tok::LBrace, 1),
            (b'}', _) => (Tok::RBrace, 1),
            (b',', _) => (Tok::Comma, 1),
            (b';', _) => (Tok::Semi, 1),
            (b'.', _) => (Tok::Dot, 1),
            (b'+', _) => (Tok::Plus, 1),
            (b'-', _) => (Tok::Minus, 1),
            (b'*', _) => (Tok::Star, 1),
            (b'/', _) => (Tok::Slash, 1),
            (b'%', _) => (Tok::Percent, 1),
            (b'^', _) => (Tok::Caret, 1),
            (b'@', _) => (Tok::At, 1),
            (b'=', _) => (Tok::Assign, 1),
            (b'<', _) => (Tok::Lt, 1),
            (b'>', _) => (Tok::Gt, 1),
            _ => {
                let ch = self.src[lo..].chars().next().unwrap();
                self.pos += ch.len_utf8();
                let span = self.span(lo);
                self.diags.error(format!("unexpected character {ch:?}"), span);
                return;
            }
        };
        self.pos += len;
        match tok {
            Tok::LParen => self.brackets.push(b'('),
            Tok::LBracket => self.brackets.push(b'['),
            Tok::LBrace => self.brackets.push(b'{'),
            Tok::RParen | Tok::RBracket | Tok::RBrace => {
                self.brackets.pop();
            }
            _ => {}
        }
        self.push(tok, lo);
    }

    fn digits(&mut self) {
        while self.peek(0).is_ascii_digit() || (self.peek(0) == b'_' && self.peek(1).is_ascii_digit()) {
            self.pos += 1;
        }
    }

    fn number(&mut self) {
        let lo = self.pos;
        self.digits();
        let mut is_float = false;
        if self.peek(0) == b'.' && self.peek(1).is_ascii_digit() {
            is_float = true;
            self.pos += 1;
            self.digits();
        }
        if matches!(self.peek(0), b'e' | b'E') {
            let sign = matches!(self.peek(1), b'+' | b'-') as usize;
            if self.peek(1 + sign).is_ascii_digit() {
                is_float = true;
                self.pos += 1 + sign;
                self.digits();
            }
        }
        if self.peek(0).is_ascii_alphanumeric() || self.peek(0) == b'_' {
            while self.peek(0).is_ascii_alphanumeric() || self.peek(0) == b'_' {
                self.pos += 1;
            }
            let span = self.span(lo);
            self.diags.error(format!("malformed number '{}'", &self.src[lo..self.pos]), span);
            return;
        }
        let text: String = self.src[lo..self.pos].chars().filter(|&c| c != '_').collect();
        let span = self.span(lo);
        if is_float {
            match text.parse::<f64>() {
                Ok(x) if x.is_finite() => self.push(Tok::Float(x), lo),
                _ => self.diags.error(format!("float literal {text} is out of range"), span),
            }
        } else {
            match text.parse::<i64>() {
                Ok(i) => self.push(Tok::Int(i), lo),
                Err(_) => self.diags.error(
                    format!("integer literal {text} is out of range (the largest int is 9223372036854775807)"),
                    span,
                ),
            }
        }
    }

    fn string(&mut self) {
        let lo = self.pos;
        self.pos += 1;
        let mut s = String::new();
        loop {
            let rest = &self.src[self.pos..];
            let Some(ch) = rest.chars().next() else {
                let span = Span::new(self.file, lo, lo + 1);
                self.diags.error("unterminated string literal", span);
                return;
            };
            match ch {
                '"' => {
                    self.pos += 1;
                    break;
                }
                '\n' => {
                    let span = Span::new(self.file, lo, lo + 1);
                    self.diags.error("unterminated string literal (strings end on the line they start)", span);
                    return;
                }
                '\\' => {
                    let esc_lo = self.pos;
                    self.pos += 1;
                    let Some(e) = self.src[self.pos..].chars().next() else { continue };
                    self.pos += e.len_utf8();
                    match e {
                        'n' => s.push('\n'),
                        't' => s.push('\t'),
                        'r' => s.push('\r'),
                        '\\' => s.push('\\'),
                        '"' => s.push('"'),
                        '0' => s.push('\0'),
                        other => {
                            let span = Span::new(self.file, esc_lo, self.pos);
                            self.diags.error(format!("unknown escape sequence '\\{other}'"), span);
                        }
                    }
                }
                c => {
                    s.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
        self.push(Tok::Str(s), lo);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok> {
        let mut d = Diags::default();
        let t = lex(src, 0, &mut d).into_iter().map(|t| t.tok).collect();
        assert!(d.is_empty(), "{:?}", d);
        t
    }

    #[test]
    fn numbers() {
        assert_eq!(toks("1_000 2.5e-3 1e9 1E+5 0..3")[..7], [
            Tok::Int(1000),
            Tok::Float(0.0025),
            Tok::Float(1e9),
            Tok::Float(1e5),
            Tok::Int(0),
            Tok::DotDot,
            Tok::Int(3)
        ]);
    }

    #[test]
    fn newlines_inside_parens_are_ignored() {
        assert_eq!(toks("f(1,\n2)\nx"), vec![
            Tok::Ident("f".into()),
            Tok::LParen,
            Tok::Int(1),
            Tok::Comma,
            Tok::Int(2),
            Tok::RParen,
            Tok::Newline,
            Tok::Ident("x".into()),
            Tok::Newline,
            Tok::Eof
        ]);
    }

    #[test]
    fn newline_after_operator_continues() {
        assert_eq!(toks("1 +\n2"), vec![Tok::Int(1), Tok::Plus, Tok::Int(2), Tok::Newline, Tok::Eof]);
    }

    #[test]
    fn errors_are_located() {
        let mut d = Diags::default();
        lex("let s = \"a\\qb\"\nlet x = 99999999999999999999", 0, &mut d);
        assert_eq!(d.len(), 2);
    }
}
