//! Name resolution tables: what a name means at module level, and the program-wide pools
//! (constants, symbols, functions) that lowering fills.

use hashbrown::HashMap;
use zygvm_vm::bytecode::*;
use zygvm_vm::program::{Const, Function, Program, StructDef};

/// What a name declared at a module's top level (or imported into it) denotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleName {
    Func { id: FuncId, arity: usize },
    Struct { id: StructId, fields: usize },
    /// A module variable; `module` is the file that owns (and may assign) it.
    Global { id: GlobalId, module: usize },
}

/// The names visible at the top level of one file: its own declarations plus what it imports.
#[derive(Default, Debug, Clone)]
pub struct ModuleScope {
    pub names: HashMap<String, ModuleName>,
}

/// Program-wide pools shared by every function being lowered.
#[derive(Default)]
pub struct Pools {
    pub consts: Vec<Const>,
    const_index: HashMap<ConstKey, ConstId>,
    pub symbols: Vec<String>,
    symbol_index: HashMap<String, SymId>,
    pub functions: Vec<Option<Function>>,
    pub structs: Vec<StructDef>,
    pub global_names: Vec<String>,
}

#[derive(Hash, PartialEq, Eq)]
enum ConstKey {
    Int(i64),
    Float(u64),
    Str(String),
}

impl Pools {
    /// The pools of an earlier program, to compile more code into it (a session's entry):
    /// its constants, symbols, structs and module variables keep their ids, and its
    /// functions' slots are reserved (empty unless the new code lowers a body into one).
    pub fn continuing(p: &Program) -> Pools {
        let mut pools = Pools::default();
        for c in &p.consts {
            pools.constant(c.clone());
        }
        for s in &p.symbols {
            pools.symbol(s);
        }
        debug_assert_eq!((pools.consts.len(), pools.symbols.len()), (p.consts.len(), p.symbols.len()));
        pools.functions = (0..p.functions.len()).map(|_| None).collect();
        pools.structs = p.structs.clone();
        pools.global_names = p.global_names.clone();
        pools
    }

    pub fn constant(&mut self, c: Const) -> ConstId {
        let key = match &c {
            Const::Int(i) => ConstKey::Int(*i),
            Const::Float(x) => ConstKey::Float(x.to_bits()),
            Const::Str(s) => ConstKey::Str(s.clone()),
        };
        if let Some(&k) = self.const_index.get(&key) {
            return k;
        }
        let k = ConstId(self.consts.len() as u32);
        self.consts.push(c);
        self.const_index.insert(key, k);
        k
    }

    pub fn symbol(&mut self, s: &str) -> SymId {
        if let Some(&k) = self.symbol_index.get(s) {
            return k;
        }
        let k = SymId(self.symbols.len() as u32);
        self.symbols.push(s.to_string());
        self.symbol_index.insert(s.to_string(), k);
        k
    }

    pub fn reserve_function(&mut self) -> FuncId {
        self.functions.push(None);
        FuncId(self.functions.len() as u32 - 1)
    }

    pub fn global(&mut self, name: &str) -> GlobalId {
        self.global_names.push(name.to_string());
        GlobalId(self.global_names.len() as u32 - 1)
    }
}
