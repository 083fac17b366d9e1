//! Any bytes through the compiler (lexer, parser, SSA, differentiator, register allocation,
//! verifier): a program or located diagnostics, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zygvm_fuzz::sandbox();
    let src = String::from_utf8_lossy(data);
    match zygvm::Program::builder().differentiable(Some(true)).compile("fuzz.zy", &src) {
        Ok(p) => {
            let _ = p.disassemble(None);
        }
        Err(e) => zygvm_fuzz::expect_clean(&e),
    }
});
