//! Whether the scoring judge decides anything (SPEC §10): a judge that gives one verdict to
//! every answer, one rationale to every answer, disagrees with an audit judge, or is often
//! wrong against human labels makes every Micro of the run doubtful. The report says so at its
//! head, with the figures, rather than beside the audit at its foot.

use serde::Serialize;

use crate::report::audit::JudgeAudit;
use crate::store::ledger::ResultRow;

/// Verdicts (or rationales) a run needs before one of them throughout is a finding: fewer
/// may honestly agree.
pub(crate) const MIN_VERDICTS: usize = 10;
/// Answers an audit judge or the labels must share with the scoring judge before their
/// disagreement is a finding.
pub(crate) const MIN_COMPARED: usize = 8;
/// Agreement with an audit judge below this is a finding. Rule judges (`contains`,
/// `token-f1`) disagree with a sound model judge on paraphrases, so the line is lenient.
pub(crate) const MIN_AGREEMENT: f64 = 0.6;
/// Accuracy against human labels below this is a finding.
pub(crate) const MIN_LABEL_ACCURACY: f64 = 0.7;

/// Why the scoring judge's verdicts are in doubt, and the sentence every view shows.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct JudgeDoubt {
    /// The judge, as the run named it (`llm-judge`, a command's program).
    pub(crate) judge: String,
    pub(crate) findings: Vec<Finding>,
    /// One line for the head of every view: the judge, and each finding with its figures.
    pub(crate) sentence: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Finding {
    /// `one_verdict`, `one_rationale`, `audit_disagrees` or `labels_disagree`.
    pub(crate) kind: &'static str,
    /// The figure the finding rests on: the share of answers with the one verdict or
    /// rationale, the agreement, the accuracy.
    pub(crate) value: f64,
    /// The answers it rests on.
    pub(crate) answers: usize,
    /// Its words in the sentence.
    pub(crate) says: String,
}

/// The doubts about the scoring judge `judge` of `results`; None when there is none.
pub(crate) fn doubt(judge: &str, results: &[ResultRow], audit: Option<&JudgeAudit>) -> Option<JudgeDoubt> {
    let mut findings = own_findings(results);
    if let Some(audit) = audit {
        findings.extend(audit_findings(audit));
    }
    if findings.is_empty() {
        return None;
    }
    let sentence = sentence(judge, &findings, audit);
    Some(JudgeDoubt {
        judge: judge.to_owned(),
        findings,
        sentence,
    })
}

/// What the judge's own verdicts and rationales say of it.
fn own_findings(results: &[ResultRow]) -> Vec<Finding> {
    let mut findings = Vec::new();
    let verdicts: Vec<bool> = results.iter().filter_map(|r| r.correct).collect();
    if verdicts.len() >= MIN_VERDICTS && verdicts.iter().all(|v| *v == verdicts[0]) {
        findings.push(Finding {
            kind: "one_verdict",
            value: 1.0,
            answers: verdicts.len(),
            says: format!(
                "it said {} to every answer ({} of {})",
                if verdicts[0] { "correct" } else { "wrong" },
                verdicts.len(),
                verdicts.len()
            ),
        });
    }
    let rationales: Vec<&str> = results
        .iter()
        .filter(|r| r.correct.is_some())
        .filter_map(|r| r.rationale.as_deref().map(str::trim))
        .filter(|r| !r.is_empty())
        .collect();
    // Looked at last, and only as far as a second answer: at paper scale there are 385k.
    let mut answers = results.iter().filter_map(|r| r.answer.as_deref());
    let mut two_answers = || answers.next().is_some_and(|first| answers.any(|a| a != first));
    if rationales.len() >= MIN_VERDICTS && rationales.iter().all(|r| *r == rationales[0]) && two_answers() {
        let mut quoted: String = rationales[0].chars().take(60).collect();
        if quoted.len() < rationales[0].len() {
            quoted.push('…');
        }
        findings.push(Finding {
            kind: "one_rationale",
            value: 1.0,
            answers: rationales.len(),
            says: format!("gave every answer the same reason (\"{quoted}\")"),
        });
    }
    findings
}

/// What the audit judges and the labels say of the judge.
fn audit_findings(audit: &JudgeAudit) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (name, audited) in &audit.judges {
        let agreement = &audited.agreement;
        if let Some(share) = agreement.agreement
            && agreement.compared >= MIN_COMPARED
            && share < MIN_AGREEMENT
        {
            findings.push(Finding {
                kind: "audit_disagrees",
                value: share,
                answers: agreement.compared,
                says: format!(
                    "`{name}` agrees with it on {share:.2} of {} answers",
                    agreement.compared
                ),
            });
        }
    }
    if let Some(labels) = &audit.labels
        && let Some(scoring) = labels.accuracy.get("scoring")
        && let Some(accuracy) = scoring.accuracy
        && scoring.compared >= MIN_COMPARED
        && accuracy < MIN_LABEL_ACCURACY
    {
        findings.push(Finding {
            kind: "labels_disagree",
            value: accuracy,
            answers: scoring.compared,
            says: format!(
                "against {} human labels its accuracy is {accuracy:.2}",
                scoring.compared
            ),
        });
    }
    findings
}

/// The line every view shows: the judge, and every figure there is on it.
fn sentence(judge: &str, findings: &[Finding], audit: Option<&JudgeAudit>) -> String {
    // The sentence gives every figure there is on the judge, each audit judge's agreement
    // and the labels' accuracy among them, whichever of them raised the doubt.
    let mut said: Vec<String> = findings
        .iter()
        .filter(|f| matches!(f.kind, "one_verdict" | "one_rationale"))
        .map(|f| f.says.clone())
        .collect();
    if let Some(audit) = audit {
        for (name, audited) in &audit.judges {
            if let Some(share) = audited.agreement.agreement {
                said.push(format!(
                    "`{name}` agrees with it on {share:.2} of {} answers",
                    audited.agreement.compared
                ));
            }
        }
        if let Some(scoring) = audit.labels.as_ref().and_then(|l| l.accuracy.get("scoring"))
            && let Some(accuracy) = scoring.accuracy
        {
            said.push(format!(
                "against {} human labels its accuracy is {accuracy:.2}",
                scoring.compared
            ));
        }
    }
    format!(
        "The judge `{judge}` may not be deciding: {}. Every Micro and Macro of this run rests on its verdicts (marked ‡).",
        said.join("; ")
    )
}

/// The judge's name from its cache identity: a built-in's name, a command's program.
pub(crate) fn judge_name(identity: Option<&serde_json::Value>) -> String {
    let program = identity.map(|i| &i["program"]);
    if let Some(name) = program.and_then(|p| p["builtin"].as_str()) {
        return name.to_owned();
    }
    if let Some(argv) = program.and_then(|p| p["command"].as_array()) {
        let words: Vec<&str> = argv.iter().filter_map(|a| a.as_str()).take(2).collect();
        if !words.is_empty() {
            return words.join(" ");
        }
    }
    "judge".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::audit::{Agreement, AuditOfJudge, JudgeAudit};
    use std::collections::BTreeMap;

    fn row(answer: &str, correct: Option<bool>, rationale: Option<&str>) -> ResultRow {
        let mut row: ResultRow = serde_json::from_value(serde_json::json!({
            "seed": 1, "compressor": "c", "condition": "own-goal", "ratio": 0.5,
            "source_id": "s", "goal_id": "g", "question_id": "q", "memory_key": "k",
            "answer": answer, "correct": correct,
        }))
        .unwrap();
        row.rationale = rationale.map(str::to_owned);
        row
    }

    #[test]
    fn a_judge_that_says_correct_to_everything_is_named_with_its_figures() {
        let rows: Vec<ResultRow> = (0..15)
            .map(|i| row(&format!("answer {i}"), Some(true), Some("one sentence")))
            .collect();
        let mut judges = BTreeMap::new();
        judges.insert(
            "contains".to_owned(),
            AuditOfJudge {
                fraction: 1.0,
                audited: 15,
                agreement: Agreement {
                    compared: 15,
                    agreement: Some(0.4),
                    ..Agreement::default()
                },
                cells: Vec::new(),
            },
        );
        let audit = JudgeAudit {
            judges,
            labels: None,
            ranking_changes: Vec::new(),
        };
        let doubt = doubt("llm-judge", &rows, Some(&audit)).unwrap();
        let kinds: Vec<&str> = doubt.findings.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, ["one_verdict", "one_rationale", "audit_disagrees"]);
        assert_eq!(
            doubt.sentence,
            "The judge `llm-judge` may not be deciding: it said correct to every answer (15 of 15); \
             gave every answer the same reason (\"one sentence\"); `contains` agrees with it on 0.40 \
             of 15 answers. Every Micro and Macro of this run rests on its verdicts (marked ‡)."
        );
    }

    /// One reason for one answer given everywhere says nothing of the judge; one reason for
    /// two answers does, however late the second answer comes.
    #[test]
    fn one_reason_is_doubted_only_when_the_answers_differ() {
        let verdict = |i: usize| Some(i.is_multiple_of(2));
        let same: Vec<ResultRow> = (0..15).map(|i| row("yes", verdict(i), Some("same"))).collect();
        assert!(doubt("j", &same, None).is_none());
        let mut late = same.clone();
        late[14] = row("no", verdict(14), Some("same"));
        let kinds: Vec<&str> = doubt("j", &late, None)
            .unwrap()
            .findings
            .iter()
            .map(|f| f.kind)
            .collect();
        assert_eq!(kinds, ["one_rationale"]);
        // An abstention's answer counts among the answers, as it did.
        let mut abstained = same;
        abstained.push(row("maybe", None, None));
        assert!(doubt("j", &abstained, None).is_some());
    }

    #[test]
    fn a_judge_that_decides_is_not_doubted_and_few_verdicts_prove_nothing() {
        let mixed: Vec<ResultRow> = (0..20)
            .map(|i| row(&format!("a{i}"), Some(i % 3 == 0), Some(&format!("reason {i}"))))
            .collect();
        assert!(doubt("exact", &mixed, None).is_none());
        let few: Vec<ResultRow> = (0..MIN_VERDICTS - 1)
            .map(|i| row(&format!("a{i}"), Some(true), None))
            .collect();
        assert!(doubt("exact", &few, None).is_none());
        // Abstentions are not a verdict.
        let mut rows = few;
        rows.push(row("x", None, None));
        assert!(doubt("exact", &rows, None).is_none());
    }

    #[test]
    fn a_judge_named_by_its_identity() {
        let builtin = serde_json::json!({"program": {"builtin": "llm-judge"}});
        assert_eq!(judge_name(Some(&builtin)), "llm-judge");
        let command = serde_json::json!({"program": {"command": ["python3", "judge.py", "--x"]}});
        assert_eq!(judge_name(Some(&command)), "python3 judge.py");
        assert_eq!(judge_name(None), "judge");
    }
}
