//! `talaria approvals list | revoke`: the commands approved with "always".
//!
//! They live in `$TALARIA_HOME/command_allowlist.txt`, one exact command a
//! line (see `talaria_agent::tools::terminal`). Entries of `command_allowlist`
//! in `config.yaml` are shown too, but only the file is edited here: the
//! configuration is the person's own text.

use std::process::ExitCode;

use clap::Subcommand;
use talaria_agent::tools::terminal;
use talaria_core::Home;

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// Show the commands approved with "always" (they run without asking).
    List,
    /// Take one back: its number in `list`, or the command itself.
    Revoke {
        /// A number from `talaria approvals list`, or the exact command
        /// (quoted, or as separate words).
        #[arg(
            required = true,
            num_args = 1..,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "N|COMMAND"
        )]
        entry: Vec<String>,
    },
}

pub fn run(home: &Home, command: ApprovalsCommand) -> anyhow::Result<ExitCode> {
    // An old file is upgraded (and the person told) before anything is
    // shown or removed, so numbers match what the file now honours.
    match terminal::upgrade_allowlist(home) {
        Ok(keys) if !keys.is_empty() => eprintln!("{}", terminal::retired_notice(&keys)),
        Ok(_) => {}
        Err(e) => {
            eprintln!(
                "talaria: cannot read {}: {e}",
                terminal::allowlist_path(home).display()
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    match command {
        ApprovalsCommand::List => list(home),
        ApprovalsCommand::Revoke { entry } => revoke(home, &entry.join(" ")),
    }
}

fn list(home: &Home) -> anyhow::Result<ExitCode> {
    let stored = terminal::read_allowlist(home)?;
    if stored.commands.is_empty() {
        println!("No commands are approved with \"always\".");
    } else {
        println!("Approved with \"always\" (each runs again without asking, exactly as written):");
        for (i, c) in stored.commands.iter().enumerate() {
            println!("{:>3}. {c}", i + 1);
        }
        println!("`talaria approvals revoke <number or command>` takes one back.");
    }
    // The configuration's own entries, for a complete picture; a broken
    // config.yaml is `talaria config check`'s to report.
    if let Ok(loaded) = crate::sections::load(home)
        && !loaded.config.command_allowlist.is_empty()
    {
        println!(
            "Also allowed by command_allowlist in {} (edit that file to change them):",
            home.config_file().display()
        );
        for entry in &loaded.config.command_allowlist {
            println!("     {entry}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn revoke(home: &Home, wanted: &str) -> anyhow::Result<ExitCode> {
    let wanted = wanted.trim();
    let stored = terminal::read_allowlist(home)?;
    // A number picks from the list; anything else is the command itself
    // (a command that is only digits is still found by its text).
    let command = match wanted.parse::<usize>() {
        Ok(n) if (1..=stored.commands.len()).contains(&n) => stored.commands[n - 1].clone(),
        _ => wanted.to_owned(),
    };
    if terminal::revoke_allowlist_entry(home, &command)? {
        println!("Revoked: {command}\nThe agent will ask again before running it.");
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "talaria: `{wanted}` is not an approved command. `talaria approvals list` shows them."
    );
    Ok(ExitCode::FAILURE)
}
