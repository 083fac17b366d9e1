//! The instrumenting profiler (`zygvm --profile`), built the way the differentiator is: by
//! rewriting bytecode. `instrument` copies a function with `ProfEnter` at its entry,
//! `ProfLine` wherever the source line changes inside a block (and at each block's start),
//! and `ProfLeave` before each `Return`; the interpreter hands those to `Profiler`, which
//! keeps, per function, calls and inclusive and exclusive time, per source line the time
//! spent on it and the calls made from it, and per call path the exclusive time (folded
//! stacks for flame-graph tools). Derivative routines are instrumented when they are made
//! and reported apart (`f (primal-with-tape)`, `f (adjoint)`, ...).
//!
//! Frames left without a `Return` (a runtime error, a checkpointed loop's recomputation that
//! ends its frame) are closed when the next event or the run's end finds them gone: every
//! activation remembers the depth of the frame it belongs to.

use crate::bytecode::{FuncId, Instr};
use crate::program::{BlockInfo, Function, Program};
use hashbrown::HashMap;
use std::fmt::Write;
use std::time::Instant;

/// `f` with the profiler's instructions inserted (blocks, spans and lists kept consistent).
pub fn instrument(program: &Program, f: &Function) -> Function {
    let line_of = |pc: usize| {
        let span = f.spans[pc];
        program.files.get(span.file as usize).map_or(0, |file| file.line_col(span.lo).0 as u32)
    };
    let end_of = |b: usize| f.blocks.get(b + 1).map_or(f.code.len(), |next| next.start as usize);
    // A block needs no mark at its start when every block that leads to it ends on the line
    // it starts with (a loop written on one line runs without records).
    let mut entering: Vec<Option<Option<u32>>> = vec![None; f.blocks.len()];
    for b in 0..f.blocks.len() {
        let (start, end) = (f.blocks[b].start as usize, end_of(b));
        if start == end {
            continue;
        }
        let last = line_of(end - 1);
        for s in f.successors(&f.code[end - 1], b) {
            let seen = &mut entering[s];
            *seen = match *seen {
                None => Some(Some(last)),
                Some(Some(l)) if l == last => Some(Some(l)),
                _ => Some(None),
            };
        }
    }
    let mut out = Function { code: vec![], spans: vec![], blocks: vec![], ..f.clone() };
    for (b, block) in f.blocks.iter().enumerate() {
        let (start, end) = (block.start as usize, end_of(b));
        out.blocks.push(BlockInfo { start: out.code.len() as u32, params: block.params });
        let mut current = if b == 0 { None } else { entering[b].flatten() };
        for pc in start..end {
            let line = line_of(pc);
            let mark = if b == 0 && pc == start {
                Some(Instr::ProfEnter { line })
            } else if current != Some(line) {
                Some(Instr::ProfLine { line })
            } else {
                None
            };
            current = Some(line);
            let leave = matches!(f.code[pc], Instr::Return { .. }).then_some(Instr::ProfLeave { line });
            for extra in mark.into_iter().chain(leave) {
                out.code.push(extra);
                out.spans.push(f.spans[pc]);
            }
            out.code.push(f.code[pc]);
            out.spans.push(f.spans[pc]);
        }
    }
    out
}

/// One running function.
struct Activation {
    func: FuncId,
    /// The depth of its frame (`Vm::frames.len()` while it runs).
    depth: usize,
    line: u32,
    entered: u64,
    /// When the time not yet attributed to a line started.
    mark: u64,
    /// Time spent in its callees.
    children: u64,
    /// Its call path (an index into `Profiler::paths`).
    path: u32,
}

#[derive(Default, Clone)]
struct FuncStats {
    calls: u64,
    inclusive: u64,
    exclusive: u64,
    /// Activations of it on the stack now (inclusive time counts only the outermost).
    running: u32,
}

#[derive(Default)]
struct FuncLines {
    first: u32,
    stats: Vec<LineStats>,
}

impl FuncLines {
    fn at(&mut self, line: u32) -> &mut LineStats {
        if self.stats.is_empty() {
            self.first = line;
        }
        if line < self.first {
            let grow = (self.first - line) as usize;
            self.stats.splice(0..0, std::iter::repeat_n(LineStats::default(), grow));
            self.first = line;
        }
        let i = (line - self.first) as usize;
        if i >= self.stats.len() {
            self.stats.resize(i + 1, LineStats::default());
        }
        &mut self.stats[i]
    }
}

#[derive(Default, Clone, Copy)]
struct LineStats {
    exclusive: u64,
    calls: u64,
    /// Time in the calls made from the line.
    inclusive_calls: u64,
}

/// What `--profile` measures, fed by the interpreter's `Prof*` instructions.
pub struct Profiler {
    start: Instant,
    stack: Vec<Activation>,
    funcs: Vec<FuncStats>,
    /// Per function, its lines' figures (indexed from the first line seen: no hashing on
    /// the way through a line).
    lines: Vec<FuncLines>,
    /// Call paths: `(parent path, function)` for each, `u32::MAX` the root.
    paths: Vec<(u32, FuncId)>,
    path_index: HashMap<(u32, FuncId), u32>,
    /// Per call path, the last callee entered from it and that call's path: recursion and
    /// loops of calls find their path without hashing.
    last_child: Vec<(FuncId, u32)>,
    /// Exclusive time per call path.
    folded: Vec<u64>,
    events: u64,
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler {
            start: Instant::now(),
            stack: vec![],
            funcs: vec![],
            lines: vec![],
            last_child: vec![],
            paths: vec![],
            path_index: HashMap::new(),
            folded: vec![],
            events: 0,
        }
    }
}

impl Profiler {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn line_stats(&mut self, func: FuncId, line: u32) -> &mut LineStats {
        if self.lines.len() <= func.index() {
            self.lines.resize_with(func.index() + 1, FuncLines::default);
        }
        self.lines[func.index()].at(line)
    }

    /// Attributes the time since the top activation's mark to its current line.
    fn settle(&mut self, now: u64) {
        if let Some(top) = self.stack.last_mut() {
            let spent = now.saturating_sub(top.mark);
            top.mark = now;
            let (func, line) = (top.func, top.line);
            self.line_stats(func, line).exclusive += spent;
        }
    }

    /// The call path of `func` called from path `parent`.
    fn path_of(&mut self, parent: u32, func: FuncId) -> u32 {
        if let Some(&(last, path)) = self.last_child.get(parent as usize) {
            if last == func {
                return path;
            }
        }
        let path = match self.path_index.get(&(parent, func)) {
            Some(&p) => p,
            None => {
                let p = self.paths.len() as u32;
                self.paths.push((parent, func));
                self.folded.push(0);
                self.last_child.push((FuncId(u32::MAX), 0));
                self.path_index.insert((parent, func), p);
                p
            }
        };
        if let Some(slot) = self.last_child.get_mut(parent as usize) {
            *slot = (func, path);
        }
        path
    }

    /// Closes the activations whose frames are gone (deeper than `depth`, or at it when
    /// `including` is set).
    pub fn unwind(&mut self, depth: usize, including: bool) {
        let gone = |a: &Activation| a.depth > depth || (including && a.depth == depth);
        if !self.stack.last().is_some_and(gone) {
            return;
        }
        let now = self.now();
        while self.stack.last().is_some_and(gone) {
            self.leave_top(now);
        }
    }

    pub fn enter(&mut self, func: FuncId, depth: usize, line: u32) {
        self.events += 1;
        self.unwind(depth, true);
        let now = self.now();
        self.settle(now);
        let parent = match self.stack.last() {
            Some(caller) => {
                let (f, l, p) = (caller.func, caller.line, caller.path);
                self.line_stats(f, l).calls += 1;
                p
            }
            None => u32::MAX,
        };
        let path = self.path_of(parent, func);
        if self.funcs.len() <= func.index() {
            self.funcs.resize(func.index() + 1, FuncStats::default());
        }
        let stats = &mut self.funcs[func.index()];
        stats.calls += 1;
        stats.running += 1;
        self.stack.push(Activation { func, depth, line, entered: now, mark: now, children: 0, path });
    }

    pub fn line(&mut self, line: u32) {
        self.events += 1;
        let now = self.now();
        self.settle(now);
        if let Some(top) = self.stack.last_mut() {
            top.line = line;
        }
    }

    pub fn leave(&mut self, depth: usize) {
        self.events += 1;
        self.unwind(depth, false);
        let now = self.now();
        self.leave_top(now);
    }

    fn leave_top(&mut self, now: u64) {
        self.settle(now);
        let Some(a) = self.stack.pop() else { return };
        let total = now.saturating_sub(a.entered);
        let own = total.saturating_sub(a.children);
        let stats = &mut self.funcs[a.func.index()];
        stats.exclusive += own;
        stats.running -= 1;
        // Time inside a recursion counts once: for its outermost activation.
        let outermost = stats.running == 0;
        if outermost {
            stats.inclusive += total;
        }
        self.folded[a.path as usize] += own;
        if let Some(caller) = self.stack.last_mut() {
            caller.children += total;
            caller.mark = now;
            let (f, l) = (caller.func, caller.line);
            if outermost {
                self.line_stats(f, l).inclusive_calls += total;
            }
        }
    }

    /// Calls counted so far of `func`.
    pub fn calls(&self, func: FuncId) -> u64 {
        self.funcs.get(func.index()).map_or(0, |s| s.calls)
    }

    /// Profiler events handled (three kinds of instruction), for the overhead estimate.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The report `--profile` prints: functions by exclusive time, then the lines that took
    /// time, then the total.
    pub fn report(&self, program: &Program) -> String {
        let names = routine_names(program);
        let name = |f: FuncId| names.get(f.index()).cloned().unwrap_or_else(|| format!("F{}", f.0));
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut out = String::new();
        let total: u64 = self.folded.iter().sum();
        let _ = writeln!(out, "profile: {:.3} ms in profiled code, {} timing records\n", ms(total), self.events);
        let mut funcs: Vec<(usize, &FuncStats)> = self.funcs.iter().enumerate().filter(|(_, s)| s.calls > 0).collect();
        funcs.sort_by(|a, b| b.1.exclusive.cmp(&a.1.exclusive).then(a.0.cmp(&b.0)));
        let _ = writeln!(out, "{:<40} {:>12} {:>14} {:>14}", "function", "calls", "inclusive ms", "exclusive ms");
        for (f, s) in &funcs {
            let _ = writeln!(out, "{:<40} {:>12} {:>14.3} {:>14.3}", name(FuncId(*f as u32)), s.calls, ms(s.inclusive), ms(s.exclusive));
        }
        let mut lines: Vec<((FuncId, u32), &LineStats)> = self
            .lines
            .iter()
            .enumerate()
            .flat_map(|(f, l)| l.stats.iter().enumerate().map(move |(i, s)| ((FuncId(f as u32), l.first + i as u32), s)))
            .filter(|(_, s)| s.exclusive > 0 || s.calls > 0)
            .collect();
        lines.sort_by(|a, b| b.1.exclusive.cmp(&a.1.exclusive).then(a.0.cmp(&b.0)));
        let _ = writeln!(out, "\n{:<40} {:>12} {:>14} {:>14}", "line", "calls made", "in calls ms", "exclusive ms");
        for ((f, line), s) in lines {
            let func = &program.functions[f.index()];
            let file = program.files.get(func.span.file as usize).map_or("?", |file| file.name.as_str());
            let at = format!("{file}:{line} ({})", name(f));
            let _ = writeln!(out, "{:<40} {:>12} {:>14.3} {:>14.3}", at, s.calls, ms(s.inclusive_calls), ms(s.exclusive));
        }
        out
    }

    /// Folded stacks (`main;f;g NANOSECONDS` per line): exclusive time per call path, what
    /// flame-graph tools (`flamegraph.pl`, `inferno-flamegraph`) read.
    pub fn folded(&self, program: &Program) -> String {
        let names = routine_names(program);
        let mut out = String::new();
        for (p, &ns) in self.folded.iter().enumerate() {
            if ns == 0 {
                continue;
            }
            let mut chain = vec![];
            let mut at = p as u32;
            while at != u32::MAX {
                let (parent, f) = self.paths[at as usize];
                chain.push(names.get(f.index()).cloned().unwrap_or_default().replace(';', ","));
                at = parent;
            }
            chain.reverse();
            let _ = writeln!(out, "{} {ns}", chain.join(";"));
        }
        out
    }
}

/// Each function's name in the report: its trace name, and for a derivative routine the
/// function it was made for and its role.
fn routine_names(program: &Program) -> Vec<String> {
    let mut names: Vec<String> = program.functions.iter().map(|f| f.trace_name().to_string()).collect();
    let made = program.derivatives.iter().enumerate().chain(program.budgeted.iter().enumerate());
    for (f, d) in made.filter_map(|(f, d)| d.as_ref().map(|d| (f, d))) {
        let base = program.functions[f].trace_name().to_string();
        for (id, role) in [
            (d.tape, "primal-with-tape"),
            (d.quiet_tape, "primal-with-tape"),
            (d.adjoint, "adjoint"),
            (d.tangent, "tangent"),
            (d.tangent_tape, "tangent of primal-with-tape"),
            (d.tangent_adjoint, "tangent of adjoint"),
        ] {
            if let Some(slot) = names.get_mut(id.index()) {
                *slot = format!("{base} ({role})");
            }
        }
        if let Some(slot) = d.gradient.and_then(|g| names.get_mut(g.index())) {
            *slot = format!("{base} (gradient)");
        }
        if let Some(slot) = d.values_gradient.and_then(|g| names.get_mut(g.index())) {
            *slot = format!("{base} (gradient at values)");
        }
    }
    for (f, t) in program.typed.iter().enumerate().filter_map(|(f, t)| Some((f, (*t)?))) {
        let base = program.functions[f].trace_name().to_string();
        let values = t.values_gradient.map(|(g, _)| (g, "typed gradient at values"));
        let pair = t.pair.into_iter().flat_map(|(q, a, _, _)| [(q, "typed quiet primal-with-tape"), (a, "typed adjoint")]);
        for (r, role) in values.into_iter().chain(pair) {
            if let Some(slot) = names.get_mut(r.index()) {
                *slot = format!("{base} ({role})");
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_time_excludes_callees_and_paths_fold() {
        let mut p = Profiler::default();
        p.enter(FuncId(0), 1, 1);
        p.enter(FuncId(1), 2, 5);
        std::thread::sleep(std::time::Duration::from_millis(2));
        p.leave(2);
        p.line(2);
        p.leave(1);
        assert_eq!((p.calls(FuncId(0)), p.calls(FuncId(1))), (1, 1));
        let (outer, inner) = (&p.funcs[0], &p.funcs[1]);
        assert!(inner.exclusive >= 2_000_000, "the callee slept 2 ms");
        // Exactly: the caller's own time is its whole time less its callee's (no clock
        // comparison, which a loaded machine or Miri's virtual clock could upset).
        assert_eq!(outer.exclusive + inner.inclusive, outer.inclusive, "the callee's time is not the caller's own");
        assert_eq!(p.line_stats(FuncId(0), 1).calls, 1);
        assert_eq!(p.paths, vec![(u32::MAX, FuncId(0)), (0, FuncId(1))]);
    }

    #[test]
    fn frames_left_without_a_return_are_closed() {
        let mut p = Profiler::default();
        p.enter(FuncId(0), 1, 1);
        p.enter(FuncId(1), 2, 1);
        p.enter(FuncId(2), 3, 1);
        // An error unwound the two inner frames; the next call from depth 1 closes them.
        p.enter(FuncId(1), 2, 1);
        assert_eq!(p.stack.len(), 2);
        p.unwind(0, false);
        assert!(p.stack.is_empty() && p.funcs.iter().all(|s| s.running == 0));
    }
}
