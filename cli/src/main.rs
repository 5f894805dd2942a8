//! The `taskfence` command-line tool: inspect and repair tasks on
//! PostgreSQL or DynamoDB. See the README for every command and the exit
//! codes.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `cli` | the command line: flags, environment variables, value parsing |
//! | `backend` | choosing and connecting to the store |
//! | `commands` | what each command does, as a `Report` |
//! | `output` | reports as tables or JSON |
//! | `error` | failures as one line and an exit code |
//! | `secrets` | secrets from files and the environment; warnings for those on the command line |

use std::io::Write;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

mod backend;
mod cli;
mod commands;
mod error;
mod output;
mod secrets;

use backend::{Target, Typed};
use cli::Cli;
use error::CliError;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("taskfence: error: {e}");
            e.code()
        }
    }
}

fn run() -> Result<(), CliError> {
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        // --help and --version are "errors" that print to stdout and exit 0.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return Ok(());
        }
        Err(e) => return Err(CliError::from_clap(&e)),
    };
    let mut cli = Cli::from_arg_matches(&matches).map_err(|e| CliError::from_clap(&e))?;
    // A variable no option reads is reported, not silently ignored.
    let known = cli::known_env(&Cli::command());
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    if let Some(unknown) = taskfence::config::unknown_env(&known) {
        secrets::warn(&unknown.to_string());
    }
    // Former command names still run, with a warning, until 0.3.
    if let Some(renamed) = cli.command.renamed() {
        secrets::warn(&renamed.warning());
    }
    let typed = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    if let Some(path) = &cli.store.database_url_file {
        if typed("database_url") {
            return Err(CliError::Usage(
                "--database-url and --database-url-file: give one of them".into(),
            ));
        }
        cli.store.database_url = Some(secrets::read_file("--database-url-file", path)?);
    } else if typed("database_url")
        && cli
            .store
            .database_url
            .as_deref()
            .is_some_and(secrets::url_has_password)
    {
        secrets::warn(
            "--database-url holds a password, which other users see in `ps`: \
             use DATABASE_URL or --database-url-file",
        );
    }
    let target = Target::choose(
        &cli.store,
        Typed {
            database_url: typed("database_url") || typed("database_url_file"),
            dynamodb_table: typed("dynamodb_table"),
        },
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Operational(format!("cannot start the async runtime: {e}")))?;
    let command = match cli.command {
        // It serves until stopped and prints no report.
        cli::Command::Web(args) => {
            let token_typed = matches
                .subcommand_matches("web")
                .is_some_and(|m| m.value_source("action_token") == Some(ValueSource::CommandLine));
            return runtime.block_on(commands::web::run(args, token_typed, &target));
        }
        command => command,
    };
    let (report, now) = runtime.block_on(commands::run(command, &target))?;
    let text = report.render(cli.json, now);
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        // `taskfence list | head`: the reader left; not an error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(CliError::Operational(format!("cannot write the output: {e}")))
        }
        _ => Ok(()),
    }
}
