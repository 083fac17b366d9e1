//! The syntax tree. Every node carries its source span.

use std::rc::Rc;
use zygvm_vm::program::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    MatMul,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Name(String),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Call(Box<Expr>, Vec<Expr>),
    /// `a[i]` (one index) or `m[i, j]` (two).
    Index(Box<Expr>, Vec<Expr>),
    Field(Box<Expr>, String),
    Tuple(Vec<Expr>),
    Array(Vec<Expr>),
    Block(Block),
    If(Box<Expr>, Block, Option<Box<Expr>>),
    While(Box<Expr>, Block),
    ForRange(Ident, Box<Expr>, Box<Expr>, Block),
    ForEach(Ident, Box<Expr>, Block),
    Closure(Rc<FnDecl>),
}

#[derive(Clone, Debug)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    /// Whether the last statement gives the block its value (an expression without `;`).
    pub has_value: bool,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum Pattern {
    Name(Ident),
    Tuple(Vec<Pattern>, Span),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignOp {
    Set,
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Debug)]
pub struct FnDecl {
    /// Empty for an anonymous closure.
    pub name: String,
    pub name_span: Span,
    pub params: Vec<Ident>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct StructDecl {
    pub name: Ident,
    pub fields: Vec<Ident>,
}

#[derive(Clone, Debug)]
pub enum Stmt {
    Let(Pattern, Expr),
    Assign(AssignOp, Expr, Expr, Span),
    Expr(Expr),
    Return(Option<Expr>, Span),
    Break(Span),
    Continue(Span),
    Fn(Rc<FnDecl>),
    Struct(StructDecl),
    Import(String, Span),
}

/// One parsed file.
#[derive(Clone, Debug)]
pub struct Module {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}
