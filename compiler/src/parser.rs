//! The parser: tokens to `ast::Module`, by recursive descent with one function per precedence
//! level (section 3). On an error it records a diagnostic and skips to the next statement, so
//! one run reports every syntax error. Nesting is bounded (`MAX_NESTING`) so hostile input
//! cannot exhaust the stack.

use crate::ast::*;
use crate::diag::Diags;
use crate::lexer::{Tok, Token};
use std::rc::Rc;
use zygvm_vm::program::Span;

const MAX_NESTING: usize = 200;

/// The error value of a parse function; the diagnostic has already been recorded.
struct Fail;
type PResult<T> = Result<T, Fail>;

pub fn parse(tokens: Vec<Token>, diags: &mut Diags) -> Module {
    let mut p = Parser { tokens, pos: 0, diags, depth: 0 };
    let lo = p.span();
    let stmts = p.statements(true);
    let span = lo.to(p.span());
    Module { stmts, span }
}

struct Parser<'a> {
    tokens: Vec<Token>,
    pos: usize,
    diags: &'a mut Diags,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Tok {
        &self.tokens[self.pos].tok
    }
    fn peek_at(&self, k: usize) -> &Tok {
        &self.tokens[(self.pos + k).min(self.tokens.len() - 1)].tok
    }
    fn span(&self) -> Span {
        self.tokens[self.pos].span
    }
    fn prev_span(&self) -> Span {
        self.tokens[self.pos.saturating_sub(1)].span
    }
    /// Consumes the current token. Names and string literals are moved out (each is consumed
    /// exactly once; the parser only ever backtracks over newlines), everything else is copied.
    fn bump(&mut self) -> Token {
        let slot = &mut self.tokens[self.pos];
        let t = match slot.tok {
            Tok::Ident(_) | Tok::Str(_) => Token { tok: std::mem::replace(&mut slot.tok, Tok::Taken), span: slot.span },
            _ => slot.clone(),
        };
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        t
    }
    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == t {
            self.bump();
            true
        } else {
            false
        }
    }
    fn fail<T>(&mut self, msg: impl Into<String>, span: Span) -> PResult<T> {
        self.diags.error(msg, span);
        Err(Fail)
    }
    fn expect(&mut self, t: &Tok, what: &str) -> PResult<Span> {
        if self.peek() == t {
            Ok(self.bump().span)
        } else {
            let found = self.peek().describe();
            self.fail(format!("expected {what}, found {found}"), self.span())
        }
    }
    /// `expect` for the bracket closing one opened at `open`: when it is missing, the error is
    /// where the parse failed and also points at the bracket that was opened, as rustc does.
    fn expect_close(&mut self, t: &Tok, what: &str, open: Span) -> PResult<Span> {
        if self.peek() == t {
            return Ok(self.bump().span);
        }
        let opener = match t {
            // (`Comma`: a tuple's `(a b`, where ',' or ')' was expected.)
            Tok::RParen | Tok::Comma => "'('",
            Tok::RBracket => "'['",
            _ => "'{'",
        };
        let found = self.peek().describe();
        self.diags.error_with(format!("expected {what}, found {found}"), self.span(), (open, format!("{opener} opened here")));
        Err(Fail)
    }
    fn skip_newlines(&mut self) {
        while self.peek() == &Tok::Newline {
            self.bump();
        }
    }
    fn ident(&mut self, what: &str) -> PResult<Ident> {
        if matches!(self.peek(), Tok::Ident(_)) {
            let t = self.bump();
            let Tok::Ident(name) = t.tok else { unreachable!() };
            return Ok(Ident { name, span: t.span });
        }
        let found = self.peek().describe();
        self.fail(format!("expected {what}, found {found}"), self.span())
    }
    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return self.fail(format!("nested too deeply (more than {MAX_NESTING} levels)"), self.span());
        }
        Ok(())
    }

    /// Skips to the start of the next statement after an error.
    fn synchronize(&mut self) {
        let start = self.pos;
        let mut depth = 0i32;
        loop {
            match self.peek() {
                Tok::Eof => return,
                Tok::RParen | Tok::RBracket if depth <= 0 => {
                    // A stray closer: skip it, so that recovery always makes progress.
                    self.bump();
                    continue;
                }
                Tok::Newline | Tok::Semi if depth <= 0 => {
                    self.bump();
                    return;
                }
                Tok::LBrace | Tok::LParen | Tok::LBracket => depth += 1,
                Tok::RBrace | Tok::RParen | Tok::RBracket => {
                    if depth <= 0 {
                        if self.pos == start && !matches!(self.peek(), Tok::RBrace) {
                            self.bump();
                        }
                        return;
                    }
                    depth -= 1;
                }
                _ => {}
            }
            self.bump();
        }
    }

    /// Statements up to `}` (or end of file at top level).
    fn statements(&mut self, top: bool) -> Vec<Stmt> {
        let mut out = vec![];
        loop {
            while matches!(self.peek(), Tok::Newline | Tok::Semi) {
                self.bump();
            }
            match self.peek() {
                Tok::Eof => break,
                Tok::RBrace if !top => break,
                Tok::RBrace => {
                    self.diags.error("unmatched '}'", self.span());
                    self.bump();
                    continue;
                }
                _ => {}
            }
            let saved_depth = self.depth;
            match self.statement(top) {
                Ok(s) => {
                    out.push(s);
                    if !matches!(self.peek(), Tok::Newline | Tok::Semi | Tok::Eof | Tok::RBrace) {
                        let found = self.peek().describe();
                        self.diags.error(format!("expected end of statement, found {found}"), self.span());
                        self.synchronize();
                    }
                }
                Err(Fail) => {
                    self.depth = saved_depth;
                    self.synchronize();
                }
            }
        }
        out
    }

    fn statement(&mut self, top: bool) -> PResult<Stmt> {
        let lo = self.span();
        match self.peek() {
            Tok::Let => {
                self.bump();
                let pat = self.pattern()?;
                self.expect(&Tok::Assign, "'=' after the name in let")?;
                let e = self.expr()?;
                Ok(Stmt::Let(pat, e))
            }
            Tok::Return => {
                self.bump();
                let value = if matches!(self.peek(), Tok::Newline | Tok::Semi | Tok::RBrace | Tok::Eof) {
                    None
                } else {
                    Some(self.expr()?)
                };
                Ok(Stmt::Return(value, lo.to(self.prev_span())))
            }
            Tok::Break => Ok(Stmt::Break(self.bump().span)),
            Tok::Continue => Ok(Stmt::Continue(self.bump().span)),
            Tok::Fn if matches!(self.peek_at(1), Tok::Ident(_)) => {
                self.bump();
                let name = self.ident("function name")?;
                Ok(Stmt::Fn(Rc::new(self.fn_rest(name.name, name.span, lo)?)))
            }
            Tok::Struct => {
                self.bump();
                let name = self.ident("struct name")?;
                self.expect(&Tok::LBrace, "'{' after the struct name")?;
                let mut fields = vec![];
                loop {
                    self.skip_newlines();
                    if self.eat(&Tok::RBrace) {
                        break;
                    }
                    fields.push(self.ident("field name")?);
                    self.skip_newlines();
                    if !self.eat(&Tok::Comma) {
                        self.skip_newlines();
                        self.expect(&Tok::RBrace, "',' or '}' in the struct's field list")?;
                        break;
                    }
                }
                Ok(Stmt::Struct(StructDecl { name, fields }))
            }
            Tok::Import => {
                self.bump();
                match self.peek().clone() {
                    Tok::Str(_) => {
                        let t = self.bump();
                        let (Tok::Str(path), sp) = (t.tok, t.span) else { unreachable!() };
                        if !top {
                            return self.fail("import is only allowed at the top level of a file", lo);
                        }
                        Ok(Stmt::Import(path, lo.to(sp)))
                    }
                    other => self.fail(format!("expected a path string after import, found {}", other.describe()), self.span()),
                }
            }
            _ => {
                let e = self.expr()?;
                let op = match self.peek() {
                    Tok::Assign => AssignOp::Set,
                    Tok::PlusAssign => AssignOp::Add,
                    Tok::MinusAssign => AssignOp::Sub,
                    Tok::StarAssign => AssignOp::Mul,
                    Tok::SlashAssign => AssignOp::Div,
                    _ => return Ok(Stmt::Expr(e)),
                };
                let op_span = self.bump().span;
                if !matches!(e.kind, ExprKind::Name(_) | ExprKind::Index(..)) {
                    let msg = if matches!(e.kind, ExprKind::Field(..)) {
                        "struct fields are immutable: cannot assign to a field"
                    } else {
                        "invalid assignment target"
                    };
                    return self.fail(msg, e.span);
                }
                let rhs = self.expr()?;
                Ok(Stmt::Assign(op, e, rhs, op_span))
            }
        }
    }

    fn pattern(&mut self) -> PResult<Pattern> {
        if self.peek() == &Tok::LParen {
            let lo = self.bump().span;
            let mut items = vec![];
            while self.peek() != &Tok::RParen {
                items.push(self.pattern()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            let hi = self.expect_close(&Tok::RParen, "')' to close the pattern", lo)?;
            if items.is_empty() {
                return self.fail("a destructuring pattern needs at least one name", lo.to(hi));
            }
            Ok(Pattern::Tuple(items, lo.to(hi)))
        } else {
            Ok(Pattern::Name(self.ident("a name to bind")?))
        }
    }

    fn fn_rest(&mut self, name: String, name_span: Span, lo: Span) -> PResult<FnDecl> {
        let open = self.expect(&Tok::LParen, "'(' to start the parameter list")?;
        let mut params: Vec<Ident> = vec![];
        while self.peek() != &Tok::RParen {
            let p = self.ident("parameter name")?;
            if params.iter().any(|q| q.name == p.name) {
                self.diags.error(format!("parameter '{}' is declared twice", p.name), p.span);
            }
            params.push(p);
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect_close(&Tok::RParen, "')' to close the parameter list", open)?;
        let body = self.block()?;
        let span = lo.to(body.span);
        Ok(FnDecl { name, name_span, params, body, span })
    }

    fn block(&mut self) -> PResult<Block> {
        let lo = self.expect(&Tok::LBrace, "'{'")?;
        self.enter()?;
        let stmts = self.statements(false);
        self.depth -= 1;
        // The block's value is its last statement's when that is an expression not followed
        // by ';' (the token before '}' tells).
        let ends_with_semi = self.tokens[self.pos.saturating_sub(1)].tok == Tok::Semi;
        let hi = self.expect_close(&Tok::RBrace, "'}' to close the block", lo)?;
        let has_value = !ends_with_semi && matches!(stmts.last(), Some(Stmt::Expr(_)));
        Ok(Block { stmts, has_value, span: lo.to(hi) })
    }

    pub fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let r = self.or_expr();
        self.depth -= 1;
        r
    }

    fn or_expr(&mut self) -> PResult<Expr> {
        let mut l = self.and_expr()?;
        while self.eat(&Tok::Or) {
            let r = self.and_expr()?;
            let span = l.span.to(r.span);
            l = Expr { kind: ExprKind::Or(Box::new(l), Box::new(r)), span };
        }
        Ok(l)
    }

    fn and_expr(&mut self) -> PResult<Expr> {
        let mut l = self.not_expr()?;
        while self.eat(&Tok::And) {
            let r = self.not_expr()?;
            let span = l.span.to(r.span);
            l = Expr { kind: ExprKind::And(Box::new(l), Box::new(r)), span };
        }
        Ok(l)
    }

    fn not_expr(&mut self) -> PResult<Expr> {
        if self.peek() == &Tok::Not {
            let lo = self.bump().span;
            self.enter()?;
            let e = self.not_expr();
            self.depth -= 1;
            let e = e?;
            let span = lo.to(e.span);
            return Ok(Expr { kind: ExprKind::Not(Box::new(e)), span });
        }
        self.comparison()
    }

    fn comparison(&mut self) -> PResult<Expr> {
        let l = self.additive()?;
        let op = match self.peek() {
            Tok::EqEq => BinOp::Eq,
            Tok::NotEq => BinOp::Ne,
            Tok::Lt => BinOp::Lt,
            Tok::Le => BinOp::Le,
            Tok::Gt => BinOp::Gt,
            Tok::Ge => BinOp::Ge,
            _ => return Ok(l),
        };
        self.bump();
        let r = self.additive()?;
        if matches!(self.peek(), Tok::EqEq | Tok::NotEq | Tok::Lt | Tok::Le | Tok::Gt | Tok::Ge) {
            return self.fail(
                "comparisons cannot be chained (write a < b and b < c)",
                self.span(),
            );
        }
        let span = l.span.to(r.span);
        Ok(Expr { kind: ExprKind::Binary(op, Box::new(l), Box::new(r)), span })
    }

    fn additive(&mut self) -> PResult<Expr> {
        let mut l = self.multiplicative()?;
        loop {
            let op = match self.peek() {
                Tok::Plus => BinOp::Add,
                Tok::Minus => BinOp::Sub,
                _ => return Ok(l),
            };
            self.bump();
            let r = self.multiplicative()?;
            let span = l.span.to(r.span);
            l = Expr { kind: ExprKind::Binary(op, Box::new(l), Box::new(r)), span };
        }
    }

    fn multiplicative(&mut self) -> PResult<Expr> {
        let mut l = self.unary()?;
        loop {
            let op = match self.peek() {
                Tok::Star => BinOp::Mul,
                Tok::Slash => BinOp::Div,
                Tok::Percent => BinOp::Mod,
                Tok::At => BinOp::MatMul,
                _ => return Ok(l),
            };
            self.bump();
            let r = self.unary()?;
            let span = l.span.to(r.span);
            l = Expr { kind: ExprKind::Binary(op, Box::new(l), Box::new(r)), span };
        }
    }

    fn unary(&mut self) -> PResult<Expr> {
        if self.peek() == &Tok::Minus {
            let lo = self.bump().span;
            self.enter()?;
            let e = self.unary();
            self.depth -= 1;
            let e = e?;
            let span = lo.to(e.span);
            return Ok(Expr { kind: ExprKind::Neg(Box::new(e)), span });
        }
        self.power()
    }

    fn power(&mut self) -> PResult<Expr> {
        let base = self.postfix()?;
        if self.eat(&Tok::Caret) {
            self.enter()?;
            let exp = self.unary();
            self.depth -= 1;
            let exp = exp?;
            let span = base.span.to(exp.span);
            return Ok(Expr { kind: ExprKind::Binary(BinOp::Pow, Box::new(base), Box::new(exp)), span });
        }
        Ok(base)
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.primary()?;
        loop {
            match self.peek() {
                Tok::LParen => {
                    let open = self.bump().span;
                    let args = self.list(&Tok::RParen, "')' to close the argument list", open)?;
                    let span = e.span.to(self.prev_span());
                    e = Expr { kind: ExprKind::Call(Box::new(e), args), span };
                }
                Tok::LBracket => {
                    let open = self.bump().span;
                    let idx = self.list(&Tok::RBracket, "']' to close the index", open)?;
                    let span = e.span.to(self.prev_span());
                    if idx.is_empty() || idx.len() > 2 {
                        return self.fail("an index takes one value (a[i]) or two (m[i, j])", span);
                    }
                    e = Expr { kind: ExprKind::Index(Box::new(e), idx), span };
                }
                Tok::Dot => {
                    self.bump();
                    let f = self.ident("field name after '.'")?;
                    let span = e.span.to(f.span);
                    e = Expr { kind: ExprKind::Field(Box::new(e), f.name), span };
                }
                _ => return Ok(e),
            }
        }
    }

    /// Comma-separated expressions up to `close` (trailing comma allowed).
    fn list(&mut self, close: &Tok, what: &str, open: Span) -> PResult<Vec<Expr>> {
        let mut items = vec![];
        while self.peek() != close {
            items.push(self.expr()?);
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect_close(close, what, open)?;
        Ok(items)
    }

    fn primary(&mut self) -> PResult<Expr> {
        let lo = self.span();
        if matches!(self.peek(), Tok::Ident(_) | Tok::Str(_)) {
            let t = self.bump();
            let kind = match t.tok {
                Tok::Ident(n) => ExprKind::Name(n),
                Tok::Str(s) => ExprKind::Str(s),
                _ => unreachable!(),
            };
            return Ok(Expr { kind, span: t.span });
        }
        let kind = match self.peek().clone() {
            Tok::Int(i) => {
                self.bump();
                ExprKind::Int(i)
            }
            Tok::Float(x) => {
                self.bump();
                ExprKind::Float(x)
            }
            Tok::True => {
                self.bump();
                ExprKind::Bool(true)
            }
            Tok::False => {
                self.bump();
                ExprKind::Bool(false)
            }
            Tok::Nil => {
                self.bump();
                ExprKind::Nil
            }
            Tok::LParen => {
                let open = self.bump().span;
                if self.eat(&Tok::RParen) {
                    ExprKind::Tuple(vec![])
                } else {
                    let first = self.expr()?;
                    if self.eat(&Tok::RParen) {
                        return Ok(Expr { kind: first.kind, span: lo.to(self.prev_span()) });
                    }
                    if self.peek() != &Tok::Comma {
                        // `(a b`: a missing ')' as much as a missing ','.
                        self.expect_close(&Tok::Comma, "',' or ')'", open)?;
                    }
                    self.bump();
                    let mut items = vec![first];
                    items.extend(self.list(&Tok::RParen, "')' to close the tuple", open)?);
                    ExprKind::Tuple(items)
                }
            }
            Tok::LBracket => {
                let open = self.bump().span;
                ExprKind::Array(self.list(&Tok::RBracket, "']' to close the array", open)?)
            }
            Tok::LBrace => ExprKind::Block(self.block()?),
            Tok::If => return self.if_expr(),
            Tok::While => {
                self.bump();
                let cond = self.expr()?;
                let body = self.block()?;
                ExprKind::While(Box::new(cond), body)
            }
            Tok::For => {
                self.bump();
                let var = self.ident("loop variable name")?;
                self.expect(&Tok::In, "'in' after the loop variable")?;
                let e = self.expr()?;
                if self.eat(&Tok::DotDot) {
                    let hi = self.expr()?;
                    let body = self.block()?;
                    ExprKind::ForRange(var, Box::new(e), Box::new(hi), body)
                } else {
                    let body = self.block()?;
                    ExprKind::ForEach(var, Box::new(e), body)
                }
            }
            Tok::Fn => {
                self.bump();
                let decl = self.fn_rest(String::new(), lo, lo)?;
                ExprKind::Closure(Rc::new(decl))
            }
            Tok::DotDot => {
                return self.fail("a range (a..b) is only allowed in a for loop", lo);
            }
            other => {
                return self.fail(format!("expected an expression, found {}", other.describe()), lo);
            }
        };
        Ok(Expr { kind, span: lo.to(self.prev_span()) })
    }

    fn if_expr(&mut self) -> PResult<Expr> {
        let lo = self.bump().span;
        let cond = self.expr()?;
        let then = self.block()?;
        // A newline before `else` is ignored.
        let save = self.pos;
        self.skip_newlines();
        let els = if self.eat(&Tok::Else) {
            if self.peek() == &Tok::If {
                self.enter()?;
                let e = self.if_expr();
                self.depth -= 1;
                Some(Box::new(e?))
            } else {
                let b = self.block()?;
                let span = b.span;
                Some(Box::new(Expr { kind: ExprKind::Block(b), span }))
            }
        } else {
            self.pos = save;
            None
        };
        let span = lo.to(self.prev_span());
        Ok(Expr { kind: ExprKind::If(Box::new(cond), then, els), span })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lexer::lex;

    fn parse_ok(src: &str) -> Module {
        let mut d = Diags::default();
        let m = parse(lex(src, 0, &mut d), &mut d);
        assert!(d.is_empty(), "{d:?}");
        m
    }

    fn errors(src: &str) -> usize {
        let mut d = Diags::default();
        parse(lex(src, 0, &mut d), &mut d);
        d.len()
    }

    #[test]
    fn precedence_of_power_and_minus() {
        let m = parse_ok("-2 ^ 2");
        let Stmt::Expr(e) = &m.stmts[0] else { panic!() };
        assert!(matches!(e.kind, ExprKind::Neg(_)));
    }

    #[test]
    fn block_value_follows_semicolon() {
        let m = parse_ok("let a = { 1; 2 }\nlet b = { 1; }");
        let Stmt::Let(_, Expr { kind: ExprKind::Block(a), .. }) = &m.stmts[0] else { panic!() };
        let Stmt::Let(_, Expr { kind: ExprKind::Block(b), .. }) = &m.stmts[1] else { panic!() };
        assert!(a.has_value);
        assert!(!b.has_value);
    }

    #[test]
    fn reports_every_error() {
        assert_eq!(errors("let = 1\nlet y = )\nprint(1 < 2 < 3)"), 3);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        // The facade runs the compiler on a 256 MB thread (`zygvm::ProgramBuilder`); a debug
        // build needs more than a test thread's 2 MB for 200 levels.
        let src = format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000));
        let n = std::thread::Builder::new().stack_size(64 << 20).spawn(move || errors(&src)).unwrap().join().unwrap();
        assert!(n >= 1);
    }

    #[test]
    fn else_on_next_line() {
        parse_ok("let v = if true {\n1\n}\nelse {\n2\n}");
    }
}
