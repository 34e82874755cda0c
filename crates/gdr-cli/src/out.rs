//! Standard output for every subcommand, through the crate's `println!`/`print!`: a write that
//! fails (a full disk, `> /dev/full`) ends the command with one line on stderr and exit code 2,
//! as any other error, instead of std's panic. A closed pipe still ends it quietly (SIGPIPE).

use std::ffi::OsString;
use std::io::Write;

/// Writes `args` to stdout and flushes, or ends the process as [`fail`] says.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        drop(out);
        fail(&e);
    }
}

/// Reports a failed write to stdout in one line and exits 2.
pub fn fail(e: &std::io::Error) -> ! {
    eprintln!("gdr: error: cannot write the output: {e}");
    std::process::exit(2)
}

/// The command line with `gdr help [COMMAND...] --help` read as `gdr [COMMAND...] --help`:
/// clap's help subcommand takes no options, so `gdr help --help` was a usage error (exit 2).
pub fn help_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut v: Vec<OsString> = args.into_iter().collect();
    let asks_help = |a: &OsString| a == "--help" || a == "-h";
    if v.get(1).is_some_and(|a| a == "help") && v[2..].iter().any(asks_help) {
        v.remove(1);
        v.retain(|a| !asks_help(a));
        v.push("--help".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn help_with_help_asks_for_help() {
        assert_eq!(help_args(args("gdr help --help")), args("gdr --help"));
        assert_eq!(help_args(args("gdr help topo -h")), args("gdr topo --help"));
        assert_eq!(help_args(args("gdr help topo")), args("gdr help topo"));
        assert_eq!(help_args(args("gdr topo --help")), args("gdr topo --help"));
        assert_eq!(help_args(args("gdr")), args("gdr"));
    }
}
