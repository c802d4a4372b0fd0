//! The Prometheus text exposition format (version 0.0.4): `# HELP` / `# TYPE` lines, then one sample a
//! line with escaped label values. Histograms are written as cumulative `_bucket{le=...}` samples, the
//! `+Inf` bucket, `_sum` and `_count`. A label whose value is empty is left out (Prometheus reads an
//! empty label as an absent one).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::family::{Family, Histogram};

/// The text of one scrape, written metric by metric.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn finish(self) -> String {
        self.out
    }

    /// `# HELP` and `# TYPE` of a metric; its samples follow.
    pub fn header(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels);
        self.out.push(' ');
        write_value(&mut self.out, value);
        self.out.push('\n');
    }

    /// A whole counter family.
    pub fn counters(&mut self, name: &str, help: &str, family: &Family<AtomicU64>) {
        self.header(name, "counter", help);
        for s in family.series() {
            let labels = pairs(family.label_names, &s.labels);
            self.sample(name, &labels, s.value.load(Ordering::Relaxed) as f64);
        }
    }

    /// A whole histogram family; recorded values are divided by `scale` (1e9 for nanoseconds → seconds).
    pub fn histograms(&mut self, name: &str, help: &str, family: &Family<Histogram>, scale: f64) {
        self.header(name, "histogram", help);
        for s in family.series() {
            let labels = pairs(family.label_names, &s.labels);
            self.histogram(name, &labels, &s.value, scale);
        }
    }

    /// One histogram's samples (its header written before).
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram, scale: f64) {
        let (cumulative, sum) = h.snapshot();
        let bucket = format!("{name}_bucket");
        let bounds: Vec<String> = h.bounds().iter().map(|b| format_value(*b as f64 / scale)).collect();
        let les = bounds.iter().map(String::as_str).chain(["+Inf"]);
        for (le, count) in les.zip(&cumulative) {
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", le));
            self.sample(&bucket, &with_le, *count as f64);
        }
        let total = *cumulative.last().unwrap_or(&0);
        self.sample(&format!("{name}_sum"), labels, sum as f64 / scale);
        self.sample(&format!("{name}_count"), labels, total as f64);
    }
}

fn pairs<'a>(names: &'static [&'static str], values: &'a [Box<str>]) -> Vec<(&'static str, &'a str)> {
    names.iter().copied().zip(values.iter().map(|v| &**v)).collect()
}

fn write_labels(out: &mut String, labels: &[(&str, &str)]) {
    let mut first = true;
    for (name, value) in labels.iter().filter(|(_, v)| !v.is_empty()) {
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    if !first {
        out.push('}');
    }
}

/// A sample value as Prometheus reads it: integers without a fraction, `+Inf`, `-Inf`, `NaN`.
pub fn format_value(v: f64) -> String {
    let mut s = String::new();
    write_value(&mut s, v);
    s
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_help_are_escaped_and_empty_labels_left_out() {
        let mut e = Exposition::default();
        e.header("m_total", "counter", "a \\ b\nc");
        e.sample("m_total", &[("a", "x\"y\\z\nw"), ("b", ""), ("c", "1")], 3.0);
        e.sample("m_total", &[("b", "")], 0.5);
        assert_eq!(
            e.finish(),
            "# HELP m_total a \\\\ b\\nc\n# TYPE m_total counter\n\
             m_total{a=\"x\\\"y\\\\z\\nw\",c=\"1\"} 3\nm_total 0.5\n"
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_then_inf_sum_and_count() {
        static BOUNDS: [u64; 2] = [250_000, 1_000_000_000];
        let f = Family::histogram(&["phase"], &BOUNDS);
        for v in [100_000, 250_000, 600_000_000, 3_000_000_000] {
            f.get(&["route"]).value.observe(v);
        }
        let mut e = Exposition::default();
        e.histograms("h_seconds", "help", &f, 1e9);
        let text = e.finish();
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(
            lines,
            [
                "h_seconds_bucket{phase=\"route\",le=\"0.00025\"} 2",
                "h_seconds_bucket{phase=\"route\",le=\"1\"} 3",
                "h_seconds_bucket{phase=\"route\",le=\"+Inf\"} 4",
                "h_seconds_sum{phase=\"route\"} 3.60035",
                "h_seconds_count{phase=\"route\"} 4",
            ]
        );
    }

    #[test]
    fn special_values_are_spelled_the_prometheus_way() {
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(42.0), "42");
    }
}
