//! `plot`, `scatter` and `histogram` write files a viewer reads: SVG that parses as XML with
//! the tick labels and the legend as text, PNG with the PNG signature and the chart's size.

use std::path::PathBuf;
mod binary;

/// Runs `source` in a fresh folder; that folder (remove it when done).
fn run_in_folder(name: &str, source: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zygvm-plots-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("p.zy"), source).unwrap();
    let out = binary::zygvm().arg("p.zy").current_dir(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}

/// The text of every element named `tag` in `svg` (a well-formedness check on the way: every
/// element opened is closed, in order).
fn texts(svg: &str, tag: &str) -> Vec<String> {
    let mut open: Vec<String> = vec![];
    let mut found = vec![];
    let mut rest = svg;
    while let Some(lt) = rest.find('<') {
        let gt = rest[lt..].find('>').expect("a tag ends") + lt;
        let inner = &rest[lt + 1..gt];
        if let Some(name) = inner.strip_prefix('/') {
            assert_eq!(open.pop().as_deref(), Some(name), "closing tag out of order");
        } else if !inner.ends_with('/') && !inner.starts_with('?') && !inner.starts_with('!') {
            let name = inner.split_whitespace().next().unwrap().to_string();
            if name == tag {
                let end = rest[gt..].find('<').unwrap() + gt;
                found.push(rest[gt + 1..end].trim().to_string());
            }
            open.push(name);
        }
        rest = &rest[gt + 1..];
    }
    assert!(open.is_empty(), "unclosed: {open:?}");
    found
}

#[test]
fn plots_write_svg_and_png() {
    let dir = run_in_folder(
        "all",
        "let losses = []\nlet l = 1.0\nfor i in 0..50 { l = l * 0.9 + 0.01\n push(losses, l) }\n\
         plot(\"loss.svg\", (\"train\", losses), (\"half\", range(0, 50) * 0.01))\n\
         plot(\"loss.png\", losses)\n\
         scatter(\"points.svg\", [1.0, 2.0, 3.0], [2.0, 4.1, 5.9])\n\
         histogram(\"hist.png\", randn(1, 1000), 20)\n\
         histogram(\"hist.svg\", [1.0, 1.0, nan(), 2.0], 5)\n",
    );
    let svg = std::fs::read_to_string(dir.join("loss.svg")).unwrap();
    assert!(svg.starts_with("<svg width=\"800\" height=\"500\""), "{}", &svg[..100]);
    let labels = texts(&svg, "text");
    assert!(labels.contains(&"train".to_string()) && labels.contains(&"half".to_string()), "{labels:?}");
    assert!(labels.iter().filter(|t| t.parse::<f64>().is_ok()).count() >= 8, "tick labels: {labels:?}");
    for name in ["points.svg", "hist.svg"] {
        let svg = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(!texts(&svg, "text").is_empty(), "{name}");
    }
    for name in ["loss.png", "hist.png"] {
        let png = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
        let (w, h) = (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert_eq!((w, h), (800, 500), "{name}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plot_errors_are_located() {
    let dir = std::env::temp_dir().join(format!("zygvm-plots-{}-errors", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (source, message) in [
        ("plot(\"x.txt\", [1.0])", "must end in .svg or .png"),
        ("plot(\"x.svg\", ([1.0, 2.0], [1.0]))", "has 2 xs and 1 ys"),
        ("histogram(\"h.svg\", [1.0], 0)", "bins must be between 1 and 10000"),
        ("scatter(\"s.svg\", [1.0], \"y\")", "scatter expects an array of numbers"),
    ] {
        std::fs::write(dir.join("e.zy"), source).unwrap();
        let out = binary::zygvm().arg("e.zy").current_dir(&dir).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{source}: {err}");
        assert!(err.contains(message) && err.contains("e.zy:1:1"), "{source}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
