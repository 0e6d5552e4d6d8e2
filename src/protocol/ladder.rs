//! A budget ladder's messages (SPEC §14): one request for every budget of a source, goal and
//! seed, and its reply, a memory per budget.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Role, default_compressor as compressor, default_protocol as protocol};

/// A ladder compressor's request (SPEC §14): one source and goal, and every budget the run needs
/// of them, ascending and distinct, in place of `token_budget`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LadderRequest<'a> {
    #[serde(borrow)]
    pub context: Cow<'a, str>,
    #[serde(borrow)]
    pub goal: Option<Cow<'a, str>>,
    #[serde(default)]
    pub params: Cow<'a, Value>,
    #[serde(default = "protocol")]
    protocol: Cow<'a, str>,
    #[serde(default = "compressor")]
    role: Role,
    #[serde(default)]
    pub seed: u64,
    pub token_budgets: Vec<usize>,
}

impl<'a> LadderRequest<'a> {
    pub(crate) fn new(
        context: &'a str,
        goal: Option<&'a str>,
        token_budgets: Vec<usize>,
        seed: u64,
        params: &'a Value,
    ) -> Self {
        LadderRequest {
            context: Cow::Borrowed(context),
            goal: goal.map(Cow::Borrowed),
            params: Cow::Borrowed(params),
            protocol: protocol(),
            role: Role::Compressor,
            seed,
            token_budgets,
        }
    }
}

/// A ladder compressor's response: one memory per budget of its request, in order.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct LadderResponse<'a> {
    #[serde(borrow)]
    pub memories: Vec<Cow<'a, str>>,
}
