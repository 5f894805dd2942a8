//! The ids of a task and of one of its attempts: UUID v7, time-ordered.
//! Beneath every other value, so errors and limits can name a task.

use std::fmt;

use uuid::Uuid;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
        pub struct $name(Uuid);

        impl $name {
            /// A new, time-ordered (UUID v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Wraps an existing UUID, e.g. one read back from storage or a queue message.
            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// The underlying UUID.
            pub const fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl From<Uuid> for $name {
            fn from(uuid: Uuid) -> Self {
                Self(uuid)
            }
        }
    };
}

uuid_id! {
    /// The stable identity of one piece of logical work. Queue messages carry it;
    /// every redelivery and every attempt refers to the same `TaskId`.
    ///
    /// ```
    /// use taskfence::TaskId;
    /// let id = TaskId::new();
    /// let parsed: TaskId = id.to_string().parse().unwrap();
    /// assert_eq!(id, parsed);
    /// ```
    TaskId
}

uuid_id! {
    /// The identity of one attempt (one claim) of a task, for tracing. It never
    /// replaces the [`TaskId`]: several attempts belong to one task.
    ///
    /// ```
    /// use taskfence::task::AttemptId;
    /// assert_ne!(AttemptId::new(), AttemptId::new());
    /// ```
    AttemptId
}
