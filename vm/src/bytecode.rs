//! The instruction set: the single source of truth (after Lua's `lopcodes.h`).
//!
//! Every function is a list of basic blocks laid out one after another in `Function::code`.
//! Registers are SSA values: each register is defined exactly once, either by one instruction
//! or as a parameter of one block. Values flow between blocks as *block arguments*: a `Jump`
//! names its target block and a register list whose registers are copied, in parallel, into
//! the target's parameter registers. Conditional branches never carry arguments (the lowering
//! splits critical edges), so every block-argument copy is visible as one `Jump`/`JumpPar`.
//!
//! ```text
//!  instruction = tag (u8) + up to three 32-bit operands   (16 bytes, `Instr`)
//!  operand kinds:
//!    def     a register this instruction defines         R[x] :=
//!    reg     a register this instruction reads           R[x]
//!    acc     a register read and then redefined          R[x] := f(R[x], ...)
//!            (superinstructions of the executable form only)
//!    konst   an index into the program's constant pool    K[x]
//!    block   a block of the same function                 B[x]
//!    list    a register list in the function's list pool  L[x] = (R[..], ...)
//!    func    a function of the program                    F[x]
//!    global  a module-variable slot                       G[x]
//!    builtin a built-in function                          BI[x]
//!    sym     an interned field name                       S[x]
//!    strukt  a struct declaration                         ST[x]
//!    imm     a small unsigned immediate
//! ```
//!
//! The table below generates the `Instr` enum, `Instr::name`, `Instr::semantics`, operand
//! iteration (`Instr::for_each_operand`, from which defs and uses follow) and, through
//! `disasm`, the listing printed by `zygvm --dump bytecode`.

use std::fmt;

macro_rules! index_types {
    ($($(#[$m:meta])* $name:ident, $prefix:literal;)*) => {$(
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u32);
        impl $name {
            #[inline(always)]
            pub fn index(self) -> usize { self.0 as usize }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    )*};
}

index_types! {
    /// A register of the current frame (an SSA value).
    Reg, "r";
    /// An entry of the program-wide constant pool.
    ConstId, "K";
    /// A basic block of the current function.
    BlockId, "B";
    /// A register list in the current function's list pool.
    ListId, "L";
    /// A function of the program.
    FuncId, "F";
    /// A module-variable slot.
    GlobalId, "G";
    /// A built-in (standard library or host) function.
    BuiltinId, "BI";
    /// An interned field name.
    SymId, "S";
    /// A struct declaration.
    StructId, "ST";
}

/// One operand of an instruction, tagged with its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Def(Reg),
    Use(Reg),
    /// Read, then redefined (only in superinstructions of the executable form).
    Acc(Reg),
    Const(ConstId),
    Block(BlockId),
    List(ListId),
    Func(FuncId),
    Global(GlobalId),
    Builtin(BuiltinId),
    Sym(SymId),
    Struct(StructId),
    Imm(u32),
}

macro_rules! operand_type {
    (def) => { Reg };
    (reg) => { Reg };
    (acc) => { Reg };
    (konst) => { ConstId };
    (block) => { BlockId };
    (list) => { ListId };
    (func) => { FuncId };
    (global) => { GlobalId };
    (builtin) => { BuiltinId };
    (sym) => { SymId };
    (strukt) => { StructId };
    (imm) => { u32 };
}

macro_rules! operand_of {
    (def, $v:expr) => { Operand::Def($v) };
    (reg, $v:expr) => { Operand::Use($v) };
    (acc, $v:expr) => { Operand::Acc($v) };
    (konst, $v:expr) => { Operand::Const($v) };
    (block, $v:expr) => { Operand::Block($v) };
    (list, $v:expr) => { Operand::List($v) };
    (func, $v:expr) => { Operand::Func($v) };
    (global, $v:expr) => { Operand::Global($v) };
    (builtin, $v:expr) => { Operand::Builtin($v) };
    (sym, $v:expr) => { Operand::Sym($v) };
    (strukt, $v:expr) => { Operand::Struct($v) };
    (imm, $v:expr) => { Operand::Imm($v) };
}

macro_rules! opcodes {
    ($( $name:ident { $($field:ident : $kind:ident),* } => $sem:literal; )*) => {
        /// One bytecode instruction. See the module documentation for the operand kinds.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum Instr {
            $( #[doc = $sem] $name { $($field: operand_type!($kind)),* }, )*
        }

        impl Instr {
            /// The opcode's mnemonic.
            pub fn name(&self) -> &'static str {
                match self { $( Instr::$name { .. } => stringify!($name), )* }
            }

            /// One line of register semantics, as in the table.
            pub fn semantics(&self) -> &'static str {
                match self { $( Instr::$name { .. } => $sem, )* }
            }

            /// Visits every operand in table order.
            #[allow(unused_variables)]
            pub fn for_each_operand(&self, mut f: impl FnMut(Operand)) {
                match *self {
                    $( Instr::$name { $($field),* } => { $( f(operand_of!($kind, $field)); )* } )*
                }
            }

            /// Visits every operand mutably (used by passes that renumber registers or blocks).
            #[allow(unused_variables)]
            pub fn map_operands(&mut self, mut f: impl FnMut(Operand) -> Operand) {
                match self {
                    $( Instr::$name { $($field),* } => {
                        $( *$field = unwrap_operand!($kind, f(operand_of!($kind, *$field))); )*
                    } )*
                }
            }
        }

        /// Every mnemonic with its semantics line, in table order (for the docs).
        pub const OPCODE_TABLE: &[(&str, &str)] = &[ $( (stringify!($name), $sem), )* ];
    };
}

macro_rules! unwrap_operand {
    (def, $e:expr) => { match $e { Operand::Def(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (reg, $e:expr) => { match $e { Operand::Use(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (acc, $e:expr) => { match $e { Operand::Acc(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (konst, $e:expr) => { match $e { Operand::Const(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (block, $e:expr) => { match $e { Operand::Block(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (list, $e:expr) => { match $e { Operand::List(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (func, $e:expr) => { match $e { Operand::Func(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (global, $e:expr) => { match $e { Operand::Global(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (builtin, $e:expr) => { match $e { Operand::Builtin(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (sym, $e:expr) => { match $e { Operand::Sym(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (strukt, $e:expr) => { match $e { Operand::Struct(r) => r, o => panic!("operand kind changed: {o:?}") } };
    (imm, $e:expr) => { match $e { Operand::Imm(r) => r, o => panic!("operand kind changed: {o:?}") } };
}

opcodes! {
    // ---- constants and module state ----
    LoadNil { dst: def } => "R[dst] := nil";
    LoadBool { dst: def, value: imm } => "R[dst] := (value != 0)";
    LoadK { dst: def, k: konst } => "R[dst] := K[k]";
    LoadFunc { dst: def, func: func } => "R[dst] := the top-level function F[func]";
    LoadBuiltin { dst: def, builtin: builtin } => "R[dst] := the built-in function BI[builtin]";
    LoadStruct { dst: def, strukt: strukt } => "R[dst] := the constructor of struct ST[strukt]";
    LoadSelf { dst: def } => "R[dst] := the closure this frame is running";
    GetGlobal { dst: def, slot: global } => "R[dst] := G[slot] (error when not yet set)";
    SetGlobal { slot: global, src: reg } => "G[slot] := R[src]";
    RunModule { func: func } => "run the imported module's main F[func] unless it already ran";

    // ---- arithmetic and logic ----
    Add { dst: def, a: reg, b: reg } => "R[dst] := R[a] + R[b]";
    Sub { dst: def, a: reg, b: reg } => "R[dst] := R[a] - R[b]";
    Mul { dst: def, a: reg, b: reg } => "R[dst] := R[a] * R[b]";
    Div { dst: def, a: reg, b: reg } => "R[dst] := R[a] / R[b]";
    Mod { dst: def, a: reg, b: reg } => "R[dst] := R[a] % R[b]";
    Pow { dst: def, a: reg, b: reg } => "R[dst] := R[a] ^ R[b]";
    MatMul { dst: def, a: reg, b: reg } => "R[dst] := R[a] @ R[b]";
    Neg { dst: def, src: reg } => "R[dst] := -R[src]";
    Not { dst: def, src: reg } => "R[dst] := not R[src] (R[src] must be bool)";
    CheckBool { src: reg } => "error unless R[src] is a bool (operands of and/or)";
    Eq { dst: def, a: reg, b: reg } => "R[dst] := R[a] == R[b]";
    Ne { dst: def, a: reg, b: reg } => "R[dst] := R[a] != R[b]";
    Lt { dst: def, a: reg, b: reg } => "R[dst] := R[a] < R[b]";
    Le { dst: def, a: reg, b: reg } => "R[dst] := R[a] <= R[b]";
    Gt { dst: def, a: reg, b: reg } => "R[dst] := R[a] > R[b]";
    Ge { dst: def, a: reg, b: reg } => "R[dst] := R[a] >= R[b]";
    Math1 { dst: def, src: reg, builtin: builtin } => "R[dst] := BI[builtin](R[src]) (one-argument math, float fast path)";

    // ---- aggregates ----
    NewArray { dst: def, items: list } => "R[dst] := [L[items]...]";
    NewTuple { dst: def, items: list } => "R[dst] := (L[items]...)";
    Index { dst: def, obj: reg, idx: reg } => "R[dst] := R[obj][R[idx]]";
    Index2 { dst: def, obj: reg, ij: list } => "R[dst] := R[obj][L[ij][0], L[ij][1]]";
    SetIndex { obj: reg, idx: reg, src: reg } => "R[obj][R[idx]] := R[src]";
    SetIndex2 { obj: reg, ijv: list } => "R[obj][L[ijv][0], L[ijv][1]] := L[ijv][2]";
    GetField { dst: def, obj: reg, field: sym } => "R[dst] := R[obj].S[field]";
    TupleGet { dst: def, src: reg, idx: imm } => "R[dst] := R[src][idx] (destructuring; R[src] checked by Unpack)";
    Unpack { src: reg, len: imm } => "error unless R[src] is a tuple of length len";
    IterPrep { dst: def, src: reg } => "R[dst] := the sequence a for-loop walks: an array or tuple itself, a dict's keys";
    Len { dst: def, src: reg } => "R[dst] := len(R[src])";
    CheckInt { src: reg } => "error unless R[src] is an int (range bounds)";

    // ---- functions ----
    MakeClosure { dst: def, func: func, captures: list } => "R[dst] := closure of F[func] capturing L[captures]";
    Call { dst: def, callee: reg, args: list } => "R[dst] := R[callee](L[args]...)";
    CallDirect { dst: def, func: func, args: list } => "R[dst] := F[func](L[args]...)";
    CallBuiltin { dst: def, builtin: builtin, args: list } => "R[dst] := BI[builtin](L[args]...)";
    NewStruct { dst: def, strukt: strukt, args: list } => "R[dst] := ST[strukt](L[args]...)";

    // ---- differentiation: the primal-with-tape routine (vm/src/ad, docs/differentiation.md) ----
    TapePush { src: reg } => "tape.push(R[src]) (a reference: for shapes, indices, immutable numbers)";
    TapeSave { src: reg } => "tape.push(snapshot of R[src]) (arrays, matrices and dicts copied: contents an adjoint reads)";
    TapePushCtl { bit: imm } => "control.push(bit) (a control-flow decision the adjoint replays)";
    TapeShape { a: reg, b: reg } => "control.push(code of R[a], R[b]); tape.push(R[a]) if it is a container; tape.push(R[b]) if it is (broadcast and identities: what the adjoint of + - and negation needs)";
    CallTape { dst: def, callee: reg, args: list } => "R[dst] := primal-with-tape of R[callee] (L[args]...)";
    CallBuiltinTape { dst: def, builtin: builtin, args: list } => "R[dst] := BI[builtin](L[args]...), recording what its pullback needs";
    LoopCkBegin { dst: def, header: block } => "R[dst] := a new checkpointed loop of this frame, headed by B[header], starting at the tape's top (routines made under a tape budget: vm/src/ad/loop_checkpoints.rs)";
    LoopCkCallee { ck: reg, callee: reg } => "before a call through a value inside R[ck]'s loop: unless R[callee] is replayable (changes nothing, draws nothing), the loop is no longer cut";
    LoopCkStep { ck: reg } => "at the header of R[ck]'s loop: count the iteration; over the budget, keep the frame's registers as a checkpoint and cut the loop's records; a recomputation that reached its end leaves the frame";

    // ---- differentiation: the adjoint routine ----
    TapePop { dst: def } => "R[dst] := tape.pop()";
    TapePopCtl { dst: def } => "R[dst] := control.pop() (as an int)";
    TapePopIf { dst: def, code: reg, mask: imm } => "R[dst] := tape.pop() if R[code] & mask else nil (an operand identity TapeShape recorded)";
    CallAdj { dst: def, callee: reg, args: list } => "R[dst] := adjoint of R[callee] (L[args] = dy, incoming adjoints...) = (d callee, d args...)";
    CallBuiltinAdj { dst: def, builtin: builtin, args: list } => "R[dst] := adjoint of BI[builtin] (L[args] = dy, incoming adjoints...) = (nil, d args...)";
    AdjAdd { dst: def, a: reg, b: reg } => "R[dst] := R[a] (+) R[b] (adjoint accumulation; nil is zero; consumes both)";
    Pull { dst: def, rule: imm, args: list } => "R[dst] := RULE[rule](L[args]...) (a pullback rule of vm/src/ad/rules.rs)";
    Gate { dst: def, src: reg, cond: reg } => "R[dst] := nil if R[cond] is false (the caller's mark on an argument whose adjoint it discards), else R[src]";
    GradSeed { dst: def, src: reg } => "R[dst] := 1.0, the cotangent of a gradient's value R[src] (error unless a number: `fused.rs` proves it for the routine at numbers), noting the tape's peak (a gradient routine's turn from primal to adjoint)";
    GradOut { dst: def, items: list } => "R[dst] := (R[y], (gradient of adjoint R[d_k] at argument R[x_k])..) for L[items] = (y, x_1..x_n, d_1..d_n) (a gradient routine's result: value_and_gradient's tuple)";
    LoopCkRewind { ck: reg } => "R[ck]'s loop is about to be reversed from its last iteration (R[ck] popped at the loop's exit; nil: not checkpointed)";
    LoopCkRefill { ck: reg } => "at the adjoint of R[ck]'s loop header: step back one iteration; when its records were cut, recompute them from the nearest earlier checkpoint";

    // ---- differentiation: the tangent routine (forward mode) ----
    Tan { dst: def, rule: imm, args: list } => "R[dst] := TANGENT[rule](L[args]...) (a tangent rule of vm/src/ad/tangents.rs)";
    CallTan { dst: def, callee: reg, args: list } => "R[dst] := (y, ẏ) of R[callee] in forward mode; L[args] = (ḟ callee, x.., ẋ..)";
    CallBuiltinTan { dst: def, builtin: builtin, args: list } => "R[dst] := (y, ẏ) of BI[builtin] in forward mode; L[args] = (x.., ẋ..)";
    CallTanDeep { dst: def, args: list, depth: imm } => "R[dst] := nested pairs of the depth-fold tangent of L[args][0] (L[args][1..]); the tangent transform of CallTan (vm/src/ad/towers.rs)";
    CallTanTape { dst: def, callee: reg, args: list } => "R[dst] := (y, ẏ) of R[callee]'s primal-with-tape, each record pushed beside its tangent; L[args] as CallTan";
    CallTanAdj { dst: def, callee: reg, args: list } => "R[dst] := (adjoints, their tangents) of R[callee]'s adjoint; L[args] = (ḟ, dy, d_in.., ḋy, ḋ_in..)";
    CallBuiltinTanTape { dst: def, builtin: builtin, args: list } => "R[dst] := (y, ẏ) of BI[builtin], recording its pullback's needs and their tangents; L[args] = (x.., ẋ..)";
    CallBuiltinTanAdj { dst: def, builtin: builtin, args: list } => "R[dst] := ((nil, d args..), tangents) of BI[builtin]'s adjoint; L[args] = (dy, d_in.., ḋy, ḋ_in..)";

    // ---- the instrumenting profiler (`--profile`: vm/src/profile.rs inserts these) ----
    ProfEnter { line: imm } => "profiler: this frame's function starts; source line `line` runs";
    ProfLine { line: imm } => "profiler: the time since the last mark was spent on the line before; line `line` runs";
    ProfLeave { line: imm } => "profiler: this frame's function returns (from line `line`)";

    // ---- control flow (block terminators) ----
    Jump { target: block, args: list } => "B[target].params := L[args] (copied in order: no overlap); goto B[target]";
    JumpPar { target: block, args: list } => "B[target].params := L[args] (parallel copy); goto B[target]";
    Branch { cond: reg, then_blk: block, else_blk: block } => "goto R[cond] ? B[then_blk] : B[else_blk] (R[cond] must be bool)";
    Return { src: reg } => "return R[src]";
    BranchCtl { then_blk: block, else_blk: block } => "goto control.pop() != 0 ? B[then_blk] : B[else_blk] (the adjoint replaying a decision)";
    // Fused compare-and-branch of the executable form (never in SSA form): the then-target is
    // the next block in layout, reached by falling through.
    BranchNotLt { a: reg, b: reg, else_blk: block } => "if not R[a] < R[b] goto B[else_blk], else fall through";
    BranchNotLe { a: reg, b: reg, else_blk: block } => "if not R[a] <= R[b] goto B[else_blk], else fall through";
    BranchNotGt { a: reg, b: reg, else_blk: block } => "if not R[a] > R[b] goto B[else_blk], else fall through";
    BranchNotGe { a: reg, b: reg, else_blk: block } => "if not R[a] >= R[b] goto B[else_blk], else fall through";
    PullAdd { dst: acc, rule: imm, args: list } => "R[dst] := R[dst] (+) RULE[rule](L[args]...) (a Pull then an AdjAdd)";
    MulAdd { dst: acc, a: reg, b: reg } => "R[dst] := R[dst] + R[a] * R[b] (a Mul then an Add, no fused rounding)";
    AddJump { dst: acc, k: reg, target: block } => "R[dst] := R[dst] + R[k]; goto B[target] (a loop step and its back edge)";
    SubJump { dst: acc, k: reg, target: block } => "R[dst] := R[dst] - R[k]; goto B[target]";
}

impl Instr {
    /// Whether this instruction ends a basic block.
    pub fn is_terminator(&self) -> bool {
        matches!(
            self,
            Instr::Jump { .. }
                | Instr::JumpPar { .. }
                | Instr::Branch { .. }
                | Instr::BranchCtl { .. }
                | Instr::Return { .. }
                | Instr::BranchNotLt { .. }
                | Instr::BranchNotLe { .. }
                | Instr::BranchNotGt { .. }
                | Instr::BranchNotGe { .. }
                | Instr::AddJump { .. }
                | Instr::SubJump { .. }
        )
    }

    /// The register this instruction defines, if any.
    pub fn def(&self) -> Option<Reg> {
        let mut d = None;
        self.for_each_operand(|o| {
            if let Operand::Def(r) | Operand::Acc(r) = o {
                d = Some(r)
            }
        });
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Instr>(), 16);
    }

    #[test]
    fn operands_follow_the_table() {
        let i = Instr::Add { dst: Reg(3), a: Reg(1), b: Reg(2) };
        let mut ops = vec![];
        i.for_each_operand(|o| ops.push(o));
        assert_eq!(ops, vec![Operand::Def(Reg(3)), Operand::Use(Reg(1)), Operand::Use(Reg(2))]);
        assert_eq!(i.def(), Some(Reg(3)));
        assert_eq!(i.name(), "Add");
        assert_eq!(i.semantics(), "R[dst] := R[a] + R[b]");
    }

    #[test]
    fn map_operands_renumbers() {
        let mut i = Instr::Jump { target: BlockId(1), args: ListId(0) };
        i.map_operands(|o| match o {
            Operand::Block(b) => Operand::Block(BlockId(b.0 + 5)),
            o => o,
        });
        assert_eq!(i, Instr::Jump { target: BlockId(6), args: ListId(0) });
        assert!(i.is_terminator());
    }
}
