//! A chat API template on taskfence: the browser presses Send (and retries it
//! on a network error), reconnects later, presses Regenerate; the service
//! saves one message per press and one reply per reply task.
//!
//! See `README.md` beside this crate for each endpoint and the guarantee it
//! relies on, and for which files to take.
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`config`] | [`Settings`] (flags + environment), [`Config`], [`Mode`], [`Limits`], [`WorkerSettings`] |
//! | `api` | routes and handlers: Send, Regenerate, `GET /tasks/{id}`; the API's problem types ([`PROBLEMS`]); [`Problem`] (`application/problem+json`) and [`IdempotencyKey`] (the header, per the IETF draft) come from `taskfence-axum` |
//! | [`replies`] | [`ReplyStore`] (complete + save reply + NOTIFY in one transaction, taskfence's `CompleteWith`), [`SaveReply`] |
//! | [`worker`] | the in-process worker: [`taskfence::runtime::Consumer`] on the store ([`taskfence::runtime::StoreQueue`]) → [`ReplyProvider`] |
//! | [`notify`] | the "reply ready" webhook: a `chat.notify` task submitted with each saved reply ([`notify::follow_up`]), delivered through the effect journal by a consumer of its own (`taskfence_axum::webhook::Webhook`) |
//! | [`service`] | [`Service`]: migrate (taskfence's and the app's [`MIGRATOR`]), start and stop the API and/or the worker |
//! | [`sim`] | scaffolding, not for copying: [`sim::SimulatedLlm`], [`sim::webhook`] (a receiver that counts deliveries), [`sim::auth`] (bearer tokens standing in for authentication, and their `CHAT_API_TOKENS` parsing) |

mod api;
pub mod config;
pub mod notify;
pub mod replies;
pub mod service;
pub mod sim;
pub mod worker;

pub use api::{OPERATION, PROBLEMS, PROVIDER_BUCKET, REPLAYED};
pub use config::{Config, Limits, Mode, PurgeSettings, Settings, WorkerSettings};
pub use replies::{ReplyStore, SaveReply, reply_store};
pub use service::{MIGRATOR, Service, StartError};
pub use taskfence_axum::{IdempotencyKey, Problem};
pub use worker::{ReplyPayload, ReplyProvider};
