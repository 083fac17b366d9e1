//! Plots written to files: `plot(path, series...)` (lines), `scatter(path, xs, ys)` and
//! `histogram(path, xs, bins)`, through plotters. The path's extension chooses the format:
//! `.svg`, with axes, tick labels and a legend (text as SVG text, laid out by plotters'
//! built-in estimate and drawn by the viewer's fonts), or `.png`, the same chart without
//! text: drawing glyphs into pixels needs a font file, which zygvm neither ships nor
//! assumes the machine has.
//!
//! A series of `plot` is an array of numbers (y against 0, 1, ...), a tuple `(xs, ys)`, or
//! either with a label first (`("loss", ys)`, `("fit", xs, ys)`: labels make a legend).
//! Non-finite points are left out (a loss that diverged still plots up to where it did).

use crate::args::*;
use plotters::coord::Shift;
use plotters::prelude::*;
use zygvm_vm::value::Value;
use zygvm_vm::{Vm, VmError, VmResult};

const SIZE: (u32, u32) = (800, 500);
const COLORS: [RGBColor; 6] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];

/// One line of `plot`: its label and points.
struct Series {
    label: Option<String>,
    points: Vec<(f64, f64)>,
}

fn series(k: usize, v: &Value) -> VmResult<Series> {
    let index = |ys: Vec<f64>| ys.into_iter().enumerate().map(|(i, y)| (i as f64, y)).collect::<Vec<_>>();
    let pairs = |xs: Vec<f64>, ys: Vec<f64>| -> VmResult<Vec<(f64, f64)>> {
        if xs.len() != ys.len() {
            return err(format!("plot: series {k} has {} xs and {} ys", xs.len(), ys.len()));
        }
        Ok(xs.into_iter().zip(ys).collect())
    };
    let (label, points) = match v {
        Value::Array(_) => (None, index(floats("plot", v)?)),
        Value::Tuple(t) => match &t[..] {
            [Value::Str(l), ys] => (Some(l.0.to_string()), index(floats("plot", ys)?)),
            [Value::Str(l), xs, ys] => (Some(l.0.to_string()), pairs(floats("plot", xs)?, floats("plot", ys)?)?),
            [xs, ys] => (None, pairs(floats("plot", xs)?, floats("plot", ys)?)?),
            _ => return err(format!("plot: series {k} must be ys, (xs, ys), (label, ys) or (label, xs, ys)")),
        },
        other => return err(format!("plot: series {k} must be an array of numbers or a tuple, not {}", other.type_name())),
    };
    Ok(Series { label, points: points.into_iter().filter(|(x, y)| x.is_finite() && y.is_finite()).collect() })
}

/// The range of `values` with a margin; a single value or none gets a unit range around it.
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    if hi - lo <= f64::EPSILON * lo.abs().max(1.0) {
        return lo - 1.0..hi + 1.0;
    }
    let pad = (hi - lo) * 0.05;
    lo - pad..hi + pad
}

/// Draws `draw` into the file at `path` (SVG or PNG by its extension).
fn to_file(name: &str, path: &str, draw: impl Fn(DrawingArea<SVGBackend, Shift>, bool) -> Result<(), String>, draw_png: impl Fn(DrawingArea<BitMapBackend, Shift>, bool) -> Result<(), String>) -> VmResult<Value> {
    let ext = std::path::Path::new(path).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let fail = |e: String| VmError::new(format!("{name} {path:?}: {e}"));
    match ext.as_deref() {
        Some("svg") => draw(SVGBackend::new(path, SIZE).into_drawing_area(), true).map_err(fail)?,
        Some("png") => draw_png(BitMapBackend::new(path, SIZE).into_drawing_area(), false).map_err(fail)?,
        _ => return err(format!("{name}: the path must end in .svg or .png, got {path:?}")),
    }
    Ok(Value::Nil)
}

macro_rules! chart {
    ($root:expr, $text:expr, $x:expr, $y:expr) => {{
        let root = $root;
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut b = ChartBuilder::on(&root);
        b.margin(20);
        if $text {
            b.x_label_area_size(35).y_label_area_size(60);
        }
        let mut chart = b.build_cartesian_2d($x, $y).map_err(|e| e.to_string())?;
        let mut mesh = chart.configure_mesh();
        if !$text {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.draw().map_err(|e| e.to_string())?;
        (root, chart)
    }};
}

fn draw_lines<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, text: bool, all: &[Series]) -> Result<(), String> {
    let x = range(all.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let y = range(all.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let (root, mut chart) = chart!(root, text, x, y);
    for (k, s) in all.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let drawn = chart.draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2))).map_err(|e| e.to_string())?;
        if let Some(l) = &s.label {
            drawn.label(l.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
    }
    if text && all.iter().any(|s| s.label.is_some()) {
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

pub fn plot(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let path = string("plot", &a[0])?;
    if a.len() < 2 {
        return err("plot needs at least one series after the path");
    }
    let all: Vec<Series> = a[1..].iter().enumerate().map(|(k, v)| series(k + 1, v)).collect::<VmResult<_>>()?;
    to_file("plot", path, |r, t| draw_lines(r, t, &all), |r, t| draw_lines(r, t, &all))
}

fn draw_points<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, text: bool, points: &[(f64, f64)]) -> Result<(), String> {
    let (root, mut chart) = chart!(root, text, range(points.iter().map(|p| p.0)), range(points.iter().map(|p| p.1)));
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, COLORS[0].filled()))).map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

pub fn scatter(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let path = string("scatter", &a[0])?;
    let (xs, ys) = (floats("scatter", &a[1])?, floats("scatter", &a[2])?);
    if xs.len() != ys.len() {
        return err(format!("scatter: {} xs and {} ys", xs.len(), ys.len()));
    }
    let points: Vec<(f64, f64)> = xs.into_iter().zip(ys).filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    to_file("scatter", path, |r, t| draw_points(r, t, &points), |r, t| draw_points(r, t, &points))
}

/// `bins` equal bins over the finite values' range: (bin edges' low end, width, counts).
fn bin(xs: &[f64], bins: usize) -> (f64, f64, Vec<u64>) {
    let r = range(xs.iter().copied().filter(|x| x.is_finite()));
    let finite: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    let (lo, hi) = match finite.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x))) {
        (l, h) if l < h => (l, h),
        _ => (r.start, r.end),
    };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0u64; bins];
    for x in finite {
        let k = (((x - lo) / width) as usize).min(bins - 1);
        counts[k] += 1;
    }
    (lo, width, counts)
}

fn draw_bars<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, text: bool, lo: f64, width: f64, counts: &[u64]) -> Result<(), String> {
    let top = counts.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.05;
    let (root, mut chart) = chart!(root, text, lo..lo + width * counts.len() as f64, 0.0..top);
    chart
        .draw_series(counts.iter().enumerate().map(|(k, &c)| {
            let x0 = lo + width * k as f64;
            Rectangle::new([(x0, 0.0), (x0 + width, c as f64)], COLORS[0].mix(0.8).filled())
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

pub fn histogram(_: &mut Vm, a: &[Value]) -> VmResult<Value> {
    let path = string("histogram", &a[0])?;
    let xs = floats("histogram", &a[1])?;
    let bins = count("histogram", &a[2])?;
    if bins == 0 || bins > 10_000 {
        return err(format!("histogram: bins must be between 1 and 10000, got {bins}"));
    }
    let (lo, width, counts) = bin(&xs, bins);
    to_file("histogram", path, |r, t| draw_bars(r, t, lo, width, &counts), |r, t| draw_bars(r, t, lo, width, &counts))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bins_count_every_finite_value_once() {
        let (lo, width, counts) = super::bin(&[0.0, 0.5, 1.0, 1.0, f64::NAN, 2.0], 4);
        assert_eq!((lo, width), (0.0, 0.5));
        assert_eq!(counts, [1, 1, 2, 1]);
    }
}
