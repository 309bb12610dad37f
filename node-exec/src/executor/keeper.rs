//! An executor kept on its own thread (applies block on netlink; a 50,000-mapping cold apply
//! takes seconds, which must not stall anyone's runtime), fed states over a channel.

use std::path::PathBuf;
use std::sync::Arc;

use kuport_proto::v1::NetnsState;
use tokio::sync::{mpsc, oneshot};

use super::{ExecError, Executor, Report, StatsHandle};
use crate::podns::Held;

/// A request to an executor run by [`Executor::serve`] or [`spawn_keeper`].
#[derive(Debug)]
pub enum Command {
    /// Make this the state to keep, and answer with the apply's result.
    Apply(Arc<NetnsState>, oneshot::Sender<Result<Report, ExecError>>),
}

/// A handle to an executor on its own thread.
#[derive(Debug, Clone)]
pub struct Keeper {
    commands: mpsc::Sender<Command>,
    stats: StatsHandle,
}

impl Keeper {
    /// Makes `state` the state to keep; resolves once it was applied (or refused).
    pub async fn apply(&self, state: Arc<NetnsState>) -> Result<Report, ExecError> {
        let gone = || ExecError::Watch {
            what: "executor",
            reason: self.stats.get().last_error.unwrap_or_else(|| "its thread ended".into()),
        };
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Apply(state, reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    pub fn stats(&self) -> StatsHandle {
        self.stats.clone()
    }

    /// Whether its thread ended (its namespace is gone, or its watches failed); its last error
    /// says why.
    pub fn ended(&self) -> bool {
        self.commands.is_closed()
    }
}

/// Starts an executor for `netns` on a thread of its own; it keeps whatever it was last asked
/// to apply until every [`Keeper`] clone is dropped, and tears nothing down then either.
pub fn spawn_keeper(netns: Option<PathBuf>) -> Result<Keeper, ExecError> {
    spawn(Executor::new(netns))
}

/// [`spawn_keeper`] for a namespace held open: the keeper also ends, on its own, once that
/// namespace can no longer be reached.
pub fn spawn_keeper_held(held: Held) -> Result<Keeper, ExecError> {
    spawn(Executor::held(held))
}

fn spawn(mut ex: Executor) -> Result<Keeper, ExecError> {
    let stats = ex.stats();
    let (commands, rx) = mpsc::channel(4);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ExecError::Watch { what: "executor runtime", reason: e.to_string() })?;
    let st = stats.clone();
    std::thread::Builder::new()
        .name("kuport-keeper".into())
        .spawn(move || {
            let result = rt.block_on(ex.serve(rx));
            if let Err(e) = result {
                st.lock().last_error = Some(e.to_string());
            }
            // The executor (and a namespace it holds open) goes with the thread.
            drop(ex);
        })
        .map_err(|e| ExecError::Watch { what: "executor thread", reason: e.to_string() })?;
    Ok(Keeper { commands, stats })
}
