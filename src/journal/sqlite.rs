//! Placeholder until the SQLite store lands.
use super::*;
#[derive(Clone)]
pub struct SqliteJournal;
fn no() -> JournalError { JournalError::Open { path: String::new(), reason: "sqlite store not built yet".into() } }
impl SqliteJournal {
    pub fn open(_p: &std::path::Path, _b: usize) -> Result<Self, JournalError> { Err(no()) }
    pub async fn claim(&self, _g: &str, _t: &str, _f: &str, _n: i64) -> Result<Claim, JournalError> { Err(no()) }
    pub async fn claim_resend(&self, _g: &str, _a: u32, _n: i64) -> Result<bool, JournalError> { Err(no()) }
    pub async fn finish(&self, _g: &str, _f: Finish, _n: i64) -> Result<(), JournalError> { Err(no()) }
    pub async fn finish_if(&self, _g: &str, _o: &[State], _f: Finish, _n: i64) -> Result<bool, JournalError> { Err(no()) }
    pub async fn get(&self, _g: &str) -> Result<Option<Row>, JournalError> { Err(no()) }
    pub async fn history(&self, _g: &str) -> Result<Vec<Event>, JournalError> { Err(no()) }
    pub async fn list(&self, _s: State, _l: usize) -> Result<Vec<Row>, JournalError> { Err(no()) }
    pub async fn recover(&self, _n: i64) -> Result<u64, JournalError> { Err(no()) }
    pub async fn prune(&self, _b: i64) -> Result<u64, JournalError> { Err(no()) }
}
