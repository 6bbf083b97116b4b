//! Markdown output: a small table builder, number formatting, and the whole
//! `bench.md` document (command, machine line, each scenario's tables and
//! the targets marked met or MISSED).

use super::{Machine, ScenarioResult};

/// A Markdown table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut s = line(&self.headers);
        s.push_str(&line(&vec!["---".to_string(); self.headers.len()]));
        for r in &self.rows {
            s.push_str(&line(r));
        }
        s
    }
}

/// Milliseconds with a precision that suits their size.
pub fn ms(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// A signed difference in ms.
pub fn delta(x: f64) -> String {
    if x >= 0.0 {
        format!("+{}", ms(x))
    } else {
        format!("-{}", ms(-x))
    }
}

pub fn pct(x: f64) -> String {
    format!("{:.2} %", x * 100.0)
}

/// `met`, `MISSED` or `n/a`.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**MISSED**",
        None => "n/a",
    }
}

/// The whole report.
pub fn markdown(command: &str, machine: &Machine, results: &[ScenarioResult]) -> String {
    let mut s = String::new();
    s.push_str("# Switchyard benchmark\n\n");
    s.push_str(&format!("Command: `{command}`\n\n"));
    s.push_str(&format!("Machine: {}\n", machine.line()));
    for r in results {
        s.push_str(&format!("\n## {} ({:.0} s)\n\n", r.name, r.seconds));
        s.push_str(&r.markdown);
        if !r.targets.is_empty() {
            s.push_str("\nTargets:\n\n");
            for t in &r.targets {
                s.push_str(&format!(
                    "- {}: {} ({})\n",
                    t.target,
                    verdict(t.met),
                    t.detail
                ));
            }
        }
        let failed: Vec<_> = r.checks.iter().filter(|c| !c.pass).collect();
        s.push_str(&format!(
            "\nCorrectness: {} of {} checks passed\n",
            r.checks.len() - failed.len(),
            r.checks.len()
        ));
        for c in failed {
            s.push_str(&format!("- FAILED {}: {}\n", c.what, c.detail));
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_tables_render_as_markdown() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), "2".into()]);
        assert_eq!(t.render(), "| a | b |\n| --- | --- |\n| 1 | 2 |\n");
        assert_eq!(delta(-0.5), "-0.50");
        assert_eq!(ms(123.4), "123");
    }
}
