//! The admin API: `POST /admin/reload` ([`crate::reload`]) and the worker
//! routes of [`workers`] (`GET`/`POST /admin/workers`,
//! `POST /admin/workers/{id}/drain`, `DELETE /admin/workers/{id}`).
//! They are served on the `--metrics-port` listener when there is one,
//! else on the API port. With `--admin-token-file` every admin request
//! must carry `Authorization: Bearer <token>` (compared in constant time;
//! 401 otherwise, the same answer whatever was wrong); without one the
//! gateway starts only when that listener is bound to loopback
//! ([`crate::config`] refuses the rest). Worker changes are made one at a
//! time, logged (one INFO line each) and counted
//! (`iris_admin_worker_changes_total`).

pub mod workers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use axum::response::Response;
use iris_openai::{ApiError, ErrorKind};
use iris_process::auth::AuthToken;

use crate::http::error_response;
use crate::server::AppState;
use crate::workers::health::HealthSettings;
use crate::workers::worker::Connect;

/// What the admin routes share.
pub struct Admin {
    /// Required of every admin request (`--admin-token-file`); `None`:
    /// the listener is loopback and open.
    token: Option<AuthToken>,
    /// How an added worker is reached and checked.
    pub connect: Connect,
    pub health: HealthSettings,
    /// How long a draining worker's requests may take before it goes.
    pub patience: Duration,
    /// One worker change at a time.
    pub changing: tokio::sync::Mutex<()>,
    changes: [[AtomicU64; Outcome::COUNT]; Action::COUNT],
}

/// A change the worker routes make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Add,
    Drain,
    Delete,
}

impl Action {
    const COUNT: usize = 3;
    const ALL: [Action; Action::COUNT] = [Action::Add, Action::Drain, Action::Delete];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Add => "add",
            Action::Drain => "drain",
            Action::Delete => "delete",
        }
    }
}

/// How a change ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Made.
    Ok,
    /// Refused for what was asked (4xx).
    Rejected,
    /// The worker could not be reached or does not serve the model (502).
    Failed,
}

impl Outcome {
    const COUNT: usize = 3;
    const ALL: [Outcome; Outcome::COUNT] = [Outcome::Ok, Outcome::Rejected, Outcome::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
        }
    }

    /// The outcome an answer of `status` reports.
    fn of_status(status: u16) -> Outcome {
        match status {
            200..=299 => Outcome::Ok,
            502 => Outcome::Failed,
            _ => Outcome::Rejected,
        }
    }
}

impl Admin {
    pub fn new(
        token: Option<AuthToken>,
        connect: Connect,
        health: HealthSettings,
        patience: Duration,
    ) -> Admin {
        Admin {
            token,
            connect,
            health,
            patience,
            changing: tokio::sync::Mutex::new(()),
            changes: Default::default(),
        }
    }

    /// Whether an `Authorization` value (if any) lets a request in.
    fn admits(&self, authorization: Option<&[u8]>) -> bool {
        match &self.token {
            None => true,
            Some(token) => authorization.is_some_and(|value| token.accepts(value)),
        }
    }

    /// Counts a change that ended with an answer of `status`.
    pub fn count(&self, action: Action, status: u16) {
        let outcome = Outcome::of_status(status);
        self.changes[action as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// `iris_admin_worker_changes_total`.
    pub fn render(&self, out: &mut String) {
        let mut samples = Vec::new();
        for action in Action::ALL {
            for outcome in Outcome::ALL {
                let count = self.changes[action as usize][outcome as usize].load(Ordering::Relaxed);
                let labels = format!(
                    "action=\"{}\",result=\"{}\"",
                    action.as_str(),
                    outcome.as_str()
                );
                samples.push((labels, count));
            }
        }
        iris_metrics::family(
            out,
            "iris_admin_worker_changes_total",
            "counter",
            "Worker changes asked of the admin API, by action (add, drain, delete) and result (ok, rejected: 4xx, failed: the worker could not be reached or does not serve the model).",
            samples,
        );
    }
}

/// Proof that a request may use the admin routes: every admin handler
/// takes it first. Refused with 401 in the OpenAI error shape, saying
/// nothing of what was wrong (no header, another scheme, another token).
pub struct Authorized;

impl FromRequestParts<Arc<AppState>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let given = parts.headers.get(header::AUTHORIZATION);
        if state.admin.admits(given.map(|v| v.as_bytes())) {
            Ok(Authorized)
        } else {
            Err(unauthorized())
        }
    }
}

/// 401 for an admin request without the right token.
fn unauthorized() -> Response {
    let message = "this admin route requires `Authorization: Bearer <token>` with the token of the gateway's --admin-token-file";
    let error =
        ApiError::new(401, ErrorKind::Authentication, message).with_code("invalid_admin_token");
    let mut response = error_response(&error);
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(token: Option<&str>) -> Admin {
        let settings = HealthSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failure_threshold: 1,
            success_threshold: 1,
            rdma_receiver_hold: Duration::ZERO,
        };
        let token = token.map(|t| AuthToken::new(t).unwrap());
        Admin::new(
            token,
            Duration::from_secs(1).into(),
            settings,
            Duration::ZERO,
        )
    }

    #[test]
    fn only_the_token_lets_a_request_in() {
        let admin = admin(Some("s3cret"));
        assert!(admin.admits(Some(b"Bearer s3cret")));
        assert!(
            admin.admits(Some(b"bearer s3cret")),
            "the scheme's case is free"
        );
        for wrong in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"Basic s3cret",
            b"s3cret",
            b"",
        ] {
            assert!(
                !admin.admits(Some(wrong)),
                "{}",
                String::from_utf8_lossy(wrong)
            );
        }
        assert!(!admin.admits(None));
        let open = self::admin(None);
        assert!(open.admits(None), "no token file: loopback, open");
    }

    #[test]
    fn changes_are_counted_by_action_and_result() {
        let admin = admin(None);
        admin.count(Action::Add, 201);
        admin.count(Action::Add, 502);
        admin.count(Action::Drain, 404);
        let mut out = String::new();
        admin.render(&mut out);
        for sample in [
            "iris_admin_worker_changes_total{action=\"add\",result=\"ok\"} 1",
            "iris_admin_worker_changes_total{action=\"add\",result=\"failed\"} 1",
            "iris_admin_worker_changes_total{action=\"drain\",result=\"rejected\"} 1",
            "iris_admin_worker_changes_total{action=\"delete\",result=\"ok\"} 0",
        ] {
            assert!(out.contains(sample), "{sample} in\n{out}");
        }
    }
}
