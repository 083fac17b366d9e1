//! A live session (the interactive prompt, `zygvm::Session`): each entry is compiled into the
//! session's program so far, not re-run with it.
//!
//! The entry is a file of its own (module 0 of its compilation). It sees the names earlier
//! entries defined, below its own and its imports'. Everything that exists keeps its id: the
//! earlier program's constants, symbols, structs, module variables and functions are the
//! prefix of the new one (`Pools::continuing`), so values a VM holds (closures, struct
//! instances, module variables) stay meaningful under the new program. A redefinition
//! (`declare_module`): a function of the same arity is compiled into the old one's slot, so
//! callers defined earlier call the new body; one of another arity is a new function (earlier
//! callers keep the old one: calls are checked against arity when compiled); `let` of an
//! existing module variable assigns its slot; a struct is a new type. The entry's main
//! returns the value of its last statement when that is an expression, for the prompt to show.

use crate::scope::{ModuleName, ModuleScope};
use crate::{compile_module, Differentiate, Loader, Prior, Source};
use zygvm_vm::error::Error;
use zygvm_vm::program::Program;

/// Compiles `source` as the next entry of the session whose program is `program` and whose
/// entries so far defined `names` (empty for the first). Returns the session's new program
/// (its `main` is the entry's) and names. On an error the session is unchanged.
pub fn compile_entry(
    program: &Program,
    names: &ModuleScope,
    source: Source<'_>,
    loader: Loader<'_>,
) -> Result<(Program, ModuleScope), Error> {
    // Routines for every function would be remade at each entry: a session makes them when used.
    let differentiate = match source.differentiate {
        Differentiate::Always => Differentiate::OnFirstUse,
        other => other,
    };
    let source = Source {
        differentiate,
        ..source
    };
    let prior = Prior { program, names };
    let (next, mut seen) = compile_module(
        source,
        program.builtins.clone(),
        program.host_functions.clone(),
        loader,
        Some(prior),
    )?;
    // Later entries may assign the entries' own module variables (module 0 of every entry's
    // compilation), not those of files an entry imported.
    for meaning in seen.names.values_mut() {
        if let ModuleName::Global { module, .. } = meaning {
            if *module != 0 {
                *module = usize::MAX;
            }
        }
    }
    Ok((next, seen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn entry(
        program: &Program,
        names: &ModuleScope,
        text: &str,
    ) -> Result<(Program, ModuleScope), Error> {
        let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
        let source = Source {
            name: "<prompt>",
            text,
            dir: Default::default(),
            differentiate: Differentiate::OnFirstUse,
        };
        compile_entry(program, names, source, &loader)
    }

    fn start() -> Program {
        let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
        let source = Source {
            name: "<start>",
            text: "",
            dir: Default::default(),
            differentiate: Differentiate::OnFirstUse,
        };
        // The compiler's tests run without the standard library.
        crate::compile(source, Arc::from(Vec::new()), vec![], &loader).unwrap()
    }

    #[test]
    fn what_exists_keeps_its_id_and_a_same_arity_redefinition_its_slot() {
        let p0 = start();
        let (p1, n1) = entry(
            &p0,
            &ModuleScope::default(),
            "let k = 2\nfn f(x) { x * k }\nfn g(x) { f(x) + 1 }",
        )
        .unwrap();
        let Some(&ModuleName::Func { id: f1, .. }) = n1.names.get("f") else {
            panic!("f is a function")
        };
        let Some(&ModuleName::Global { id: k1, module: 0 }) = n1.names.get("k") else {
            panic!("k is the session's")
        };
        let (p2, n2) = entry(&p1, &n1, "fn f(x) { x + k }\nlet k = 3\ng(1)").unwrap();
        assert_eq!(
            n2.names.get("f"),
            Some(&ModuleName::Func { id: f1, arity: 1 }),
            "same slot"
        );
        assert_eq!(
            n2.names.get("k"),
            Some(&ModuleName::Global { id: k1, module: 0 }),
            "same variable"
        );
        assert!(
            p2.functions.len() > p1.functions.len(),
            "the entry's main is new"
        );
        assert!(
            Arc::ptr_eq(&p1.functions[0], &p2.functions[0]),
            "untouched functions are shared"
        );
        assert!(
            !Arc::ptr_eq(&p1.functions[f1.index()], &p2.functions[f1.index()]),
            "f's body is replaced"
        );
        let (_, n3) = entry(&p2, &n2, "fn f(x, y) { x + y }").unwrap();
        assert!(
            matches!(n3.names.get("f"), Some(ModuleName::Func { id, arity: 2 }) if *id != f1),
            "another arity is another function"
        );
    }

    #[test]
    fn an_entry_that_does_not_compile_reports_its_own_lines() {
        let p0 = start();
        let (p1, n1) = entry(&p0, &ModuleScope::default(), "fn f(x) { x }").unwrap();
        let e = entry(&p1, &n1, "f(1)\nlet y = nope")
            .err()
            .expect("an unknown name")
            .to_string();
        assert!(e.contains("<prompt>:2:9"), "{e}");
        let twice = entry(&p1, &n1, "fn h() { 1 }\nfn h() { 2 }")
            .err()
            .expect("h twice")
            .to_string();
        assert!(twice.contains("defined twice"), "{twice}");
    }
}
