//! `zygvm --dump asm`: a compiled function's machine code, each instruction's code under the
//! bytecode instruction it implements, then the code shared by the function (the way in and
//! out, entry guards, loop stubs, rare exits). The host's own code is decoded: by iced-x86
//! on x86-64 (Intel syntax), by yaxpeax-arm on AArch64.

use std::fmt::Write;
use zygvm_vm::bytecode::FuncId;
use zygvm_vm::disasm::instr_text;
use zygvm_vm::native::NativeCode;
use zygvm_vm::program::Program;

pub fn listing(program: &Program, func: FuncId, code: &NativeCode) -> Option<String> {
    let buf = code.owner.downcast_ref::<dynasmrt::ExecutableBuffer>()?;
    let bytes: &[u8] = &buf[..code.size.min(buf.len())];
    let base = buf.ptr(dynasmrt::AssemblyOffset(0)) as u64;
    let f = &program.functions[func.index()];
    let mut out = String::new();
    let _ = writeln!(out, "native code of {} ({} bytes at {base:#x})", f.trace_name(), code.size);
    // Sections: [0, first instruction) is the way in and out; then one per instruction; the
    // code after the last instruction's is shared (guards, stubs, cold exits).
    let mut marks: Vec<(usize, Option<u32>)> = vec![(0, None)];
    marks.extend(code.pc_offsets.iter().map(|&(pc, off)| (off as usize, Some(pc))));
    let mut next_mark = 0;
    for (at, text) in decode(bytes) {
        while next_mark < marks.len() && marks[next_mark].0 <= at {
            match marks[next_mark].1 {
                None => out.push_str("  ; the way in (callee-saved registers, frame and VM pinned) and out\n"),
                Some(u32::MAX) => out.push_str("  ; shared: entry guards, ways into and out of cached loops, rare exits\n"),
                Some(pc) => {
                    let line = program.files[f.spans[pc as usize].file as usize].line_col(f.spans[pc as usize].lo).0;
                    let _ = writeln!(out, "  {pc:4}  [{line:3}]  {}", instr_text(f, program, &f.code[pc as usize]));
                }
            }
            next_mark += 1;
        }
        let _ = writeln!(out, "        {at:5x}  {text}");
    }
    Some(out)
}

/// Each instruction of x86-64 machine code, with its offset from the start of the buffer
/// (jump targets then read as the left column).
#[cfg(target_arch = "x86_64")]
fn decode(bytes: &[u8]) -> Vec<(usize, String)> {
    use iced_x86::{Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter};
    let mut formatter = IntelFormatter::new();
    formatter.options_mut().set_branch_leading_zeros(false);
    let mut decoder = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut lines = vec![];
    while decoder.can_decode() {
        let at = decoder.ip() as usize;
        decoder.decode_out(&mut instr);
        let mut text = String::new();
        formatter.format(&instr, &mut text);
        lines.push((at, text));
    }
    lines
}

/// Each instruction of AArch64 machine code (one 4-byte word each), with its offset; branch
/// targets print relative to the branch (`$+0x40`).
#[cfg(target_arch = "aarch64")]
fn decode(bytes: &[u8]) -> Vec<(usize, String)> {
    use yaxpeax_arch::{Decoder, U8Reader};
    let decoder = yaxpeax_arm::armv8::a64::InstDecoder::default();
    bytes
        .chunks_exact(4)
        .enumerate()
        .map(|(k, word)| {
            let text = match decoder.decode(&mut U8Reader::new(word)) {
                Ok(instr) => instr.to_string(),
                Err(e) => format!(".word {:#010x}  ; {e}", u32::from_le_bytes(word.try_into().expect("4 bytes"))),
            };
            (4 * k, text)
        })
        .collect()
}
