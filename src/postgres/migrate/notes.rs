//! [`UpgradeNote`]: what applying a migration asks of an operator, the
//! note each embedded file carries and the status report repeats.

/// What applying one migration asks of an operator, beyond running it.
///
/// Each embedded migration lists its notes; [`PgStore::migration_status`](crate::PgStore::migration_status)
/// returns them with it, `taskfence migrate --status` prints them on its
/// line, and the CHANGELOG's "Upgrading" section repeats them (checked by a
/// test). `Display` is the whole advice, [`summary`](Self::summary) the few
/// words of a status line.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
/// use taskfence::postgres::UpgradeNote;
/// for migration in store.migration_status().await?.pending() {
///     for note in migration.notes {
///         if matches!(note, UpgradeNote::StopOldWorkers { .. }) {
///             println!("stop the workers first: {note}");
///         }
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpgradeNote {
    /// Stop every process of the previous release (workers, API replicas)
    /// before applying it, and start the new release after: the old code
    /// would keep writing the layout the migration replaces.
    StopOldWorkers {
        /// What would go wrong otherwise.
        why: &'static str,
    },
    /// It builds indexes on `table` inside its transaction, which blocks
    /// writes to the table while they build. On a large table, run
    /// `statements` first (`CREATE INDEX CONCURRENTLY`, the same names and
    /// definitions): the migration then finds the indexes and does nothing.
    BuildIndexesConcurrently {
        /// The table the indexes are on.
        table: &'static str,
        /// What to run first, unqualified (with `search_path` set to the
        /// store's schema), each statement on its own (not in a transaction).
        statements: &'static [&'static str],
    },
    /// It holds an exclusive lock on `tables` for time that grows with their
    /// size, and nothing can be prepared ahead: apply it in a quiet window.
    LocksTables {
        /// The tables locked.
        tables: &'static [&'static str],
        /// What it does under the lock.
        why: &'static str,
    },
}

impl UpgradeNote {
    /// A stable name for scripts: `stop_old_workers`,
    /// `build_indexes_concurrently` or `locks_tables`.
    ///
    /// ```
    /// use taskfence::postgres::UpgradeNote;
    /// let note = UpgradeNote::StopOldWorkers { why: "…" };
    /// assert_eq!(note.label(), "stop_old_workers");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Self::StopOldWorkers { .. } => "stop_old_workers",
            Self::BuildIndexesConcurrently { .. } => "build_indexes_concurrently",
            Self::LocksTables { .. } => "locks_tables",
        }
    }

    /// The few words of a status line: `stop the old workers first`.
    ///
    /// ```
    /// use taskfence::postgres::UpgradeNote;
    /// let note = UpgradeNote::LocksTables { tables: &["handoffs"], why: "…" };
    /// assert_eq!(note.summary(), "locks handoffs while it runs");
    /// ```
    pub fn summary(&self) -> String {
        match self {
            Self::StopOldWorkers { .. } => "stop the old workers first".into(),
            Self::BuildIndexesConcurrently { table, .. } => {
                format!("large {table} table: build its indexes concurrently first")
            }
            Self::LocksTables { tables, .. } => {
                format!("locks {} while it runs", tables.join(" and "))
            }
        }
    }

    /// The statements to run before the migration, one at a time, outside a
    /// transaction, with `search_path` set to the store's schema (empty unless
    /// [`BuildIndexesConcurrently`](Self::BuildIndexesConcurrently)).
    ///
    /// ```
    /// use taskfence::postgres::UpgradeNote;
    /// assert!(UpgradeNote::StopOldWorkers { why: "…" }.statements().is_empty());
    /// ```
    pub fn statements(&self) -> &'static [&'static str] {
        match self {
            Self::BuildIndexesConcurrently { statements, .. } => statements,
            _ => &[],
        }
    }
}

impl std::fmt::Display for UpgradeNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::StopOldWorkers { why } => write!(
                f,
                "stop the workers of the previous release before applying it: {why}"
            ),
            Self::BuildIndexesConcurrently { table, .. } => write!(
                f,
                "builds indexes on {table} inside its transaction, blocking writes to it while they build; \
                 on a large table, build them first with the CREATE INDEX CONCURRENTLY statements of this note \
                 (search_path set to the schema), one at a time; one that fails leaves an invalid index: \
                 DROP INDEX CONCURRENTLY it and build it again"
            ),
            Self::LocksTables { tables, why } => write!(
                f,
                "holds an exclusive lock on {} while it {why}; apply it in a quiet window",
                tables.join(" and ")
            ),
        }
    }
}
