//! Any source compiled and run under small limits (fuel, depth, memory, time); then run again
//! on the same VM, which must still work after whatever the first run did.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zygvm_fuzz::sandbox();
    let src = String::from_utf8_lossy(data);
    let Ok(program) = zygvm::Program::builder().differentiable(None).compile("fuzz.zy", &src) else { return };
    let mut vm = zygvm::Vm::new(&program);
    vm.set_output(std::io::sink());
    vm.set_limits(zygvm_fuzz::limits());
    for _ in 0..2 {
        if let Err(e) = vm.run() {
            zygvm_fuzz::expect_clean(&e);
        }
    }
});
