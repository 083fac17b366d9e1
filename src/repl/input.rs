//! Reading an entry at the prompt: line editing and history (rustyline), multi-line input
//! (an entry continues while brackets are open or a line ends with an operator), tab
//! completion of the session's names, built-ins, keywords and prompt commands.

use rustyline::completion::Completer;
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};

/// The words tab completion offers.
#[derive(Default)]
pub struct Words {
    pub words: Vec<String>,
}

const KEYWORDS: &[&str] = &[
    "fn", "let", "if", "else", "while", "for", "in", "return", "break", "continue", "struct",
    "import", "true", "false", "nil", "and", "or", "not",
];

impl Words {
    /// The session's names, the built-ins (`builtins`) and the language's keywords.
    pub fn update(&mut self, names: Vec<String>, builtins: &[String]) {
        self.words = names;
        self.words.extend(builtins.iter().cloned());
        self.words.extend(KEYWORDS.iter().map(|k| k.to_string()));
        self.words
            .extend(super::commands::NAMES.iter().map(|c| c.to_string()));
        self.words.sort();
        self.words.dedup();
    }

    /// The words that start with the identifier (or `:command`) ending at `pos`, and where it
    /// starts.
    pub fn candidates(&self, line: &str, pos: usize) -> (usize, Vec<String>) {
        let before = &line[..pos];
        let start = before
            .char_indices()
            .rev()
            .find(|&(_, c)| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let word = &before[start..];
        if word.is_empty() {
            return (pos, vec![]);
        }
        (
            start,
            self.words
                .iter()
                .filter(|w| w.starts_with(word))
                .cloned()
                .collect(),
        )
    }
}

impl Completer for Words {
    type Candidate = String;
    fn complete(
        &self,
        line: &str,
        pos: usize,
        _: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        Ok(self.candidates(line, pos))
    }
}

impl Hinter for Words {
    type Hint = String;
}
impl Highlighter for Words {}
impl Validator for Words {}
impl Helper for Words {}

pub type LineEditor = Editor<Words, DefaultHistory>;

/// Reads one entry, line by line while it is unfinished. `None` at the end of input
/// (Ctrl-D); an empty entry when Ctrl-C abandons the lines typed so far.
pub fn read_entry(rl: &mut LineEditor) -> Option<String> {
    let mut entry = String::new();
    loop {
        let prompt = if entry.is_empty() { "zy> " } else { "... " };
        match rl.readline(prompt) {
            Ok(line) => {
                entry.push_str(&line);
                entry.push('\n');
                if !incomplete(&entry) {
                    return Some(entry);
                }
            }
            Err(ReadlineError::Interrupted) => return Some(String::new()),
            Err(_) => return None,
        }
    }
}

/// Whether an entry is unfinished: an open bracket or string, or a trailing operator.
fn incomplete(text: &str) -> bool {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => in_str = !in_str,
            '#' if !in_str => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '(' | '[' | '{' if !in_str => depth += 1,
            ')' | ']' | '}' if !in_str => depth -= 1,
            _ => {}
        }
    }
    let t = text.trim_end();
    let trailing_symbol = ["+", "-", "*", "/", "%", "^", "@", "=", ",", "."]
        .iter()
        .any(|op| t.ends_with(op));
    // A word operator only as a whole word (`let color` is complete).
    let last_word = t
        .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .unwrap_or("");
    let trailing_op = trailing_symbol || ["and", "or", "not"].contains(&last_word);
    depth > 0 || in_str || trailing_op
}

#[cfg(test)]
mod tests {
    use super::{incomplete, Words};

    #[test]
    fn open_brackets_continue_the_entry() {
        assert!(incomplete("fn f(x) {\n"));
        assert!(incomplete("let a = 1 +\n"));
        assert!(!incomplete("let a = [1, 2]\n"));
        assert!(!incomplete("print(\"{\")\n"));
        assert!(incomplete("let ok = a and\n"));
        assert!(!incomplete("let hue = color\n"));
    }

    #[test]
    fn completion_offers_names_that_start_with_the_word() {
        let mut w = Words::default();
        w.update(
            vec!["my_long_name".into(), "my_other".into()],
            &["sin".into(), "sqrt".into()],
        );
        assert_eq!(
            w.candidates("print(my_l", 10),
            (6, vec!["my_long_name".to_string()])
        );
        assert_eq!(
            w.candidates("s", 1).1,
            vec!["sin".to_string(), "sqrt".to_string(), "struct".to_string()]
        );
        assert_eq!(w.candidates(":ti", 3), (0, vec![":time".to_string()]));
        assert_eq!(w.candidates("x + ", 4).1, Vec::<String>::new());
    }
}
