package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// curve is one target's open-loop sweep: its points at the rates it kept up
// with, and the first it did not, if any.
type curve struct {
	target *target
	points []ratePoint
}

// sweep offers each rate in turn to every target still keeping up, each
// run from a fresh copy of the target's prefilled data, the targets
// alternating as in the rounds. A target's curve stops at the first rate it
// cannot keep up with.
func sweep(tgs []*target, work string, cfg config) ([]curve, error) {
	curves := make([]curve, len(tgs))
	for i, tg := range tgs {
		curves[i].target = tg
	}
	for r, rate := range cfg.rates {
		fmt.Printf("\nopen loop, offered %d/s\n", rate)
		for j := range tgs {
			c := &curves[(r+j)%len(tgs)]
			if n := len(c.points); n > 0 && !c.points[n-1].keptUp {
				continue
			}
			p, err := offer(c.target, work, cfg, rate)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.target.name, err)
			}
			verdict := "kept up"
			if !p.keptUp {
				verdict = "fell behind: its curve stops here"
			}
			fmt.Printf("  %-9s achieved %8.0f/s  p50 %-9s p99 %-9s failed %d  %s\n",
				c.target.name, p.achieved, round(p.p50), round(p.p99), p.failed, verdict)
			c.points = append(c.points, p)
		}
	}
	return curves, nil
}

// offer runs one target from a copy of its prefilled data at one offered
// rate.
func offer(tg *target, work string, cfg config, rate int) (ratePoint, error) {
	dir := filepath.Join(work, tg.name, "run")
	if err := copyTemplate(filepath.Join(work, tg.name, "template"), dir); err != nil {
		return ratePoint{}, err
	}
	defer os.RemoveAll(dir)
	inst, err := tg.start(dir, freeAddr(), true)
	if err != nil {
		return ratePoint{}, fmt.Errorf("start: %w", err)
	}
	defer inst.stop()
	if err := checkContract(inst.url); err != nil {
		return ratePoint{}, err
	}
	return openLoop(inst.url, cfg.conns, rate, cfg.warmup, cfg.plotDuration), nil
}

func printSweep(cfg config, curves []curve) {
	fmt.Printf("\nopen loop: %s measured per rate after %s, %d connections, a fresh copy of %d prefilled events per run; latency from when each request was due\n\n", cfg.plotDuration, cfg.warmup, cfg.conns, cfg.prefill)
	fmt.Println("| target | offered req/s | achieved req/s | p50 | p99 | kept up |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
	for _, c := range curves {
		for _, p := range c.points {
			fmt.Printf("| %s | %d | %.0f | %s | %s | %t |\n", c.target.name, p.offered, p.achieved, round(p.p50), round(p.p99), p.keptUp)
		}
	}
}

// plotCurves draws each target's p99 (solid) and p50 (dashed) latency
// against its achieved throughput, over the rates it kept up with.
func plotCurves(cfg config, curves []curve) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Durable ingest behind POST /v1/events, open loop: %d connections, %s per rate, %d events kept before", cfg.conns, cfg.plotDuration, cfg.prefill)
	if cfg.plotNote != "" {
		p.Title.Text += "\n" + cfg.plotNote
	}
	p.X.Label.Text = "achieved throughput (req/s)"
	p.Y.Label.Text = "latency, ms: p99 solid, p50 dashed"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	p.X.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), 0.0
	for i, c := range curves {
		var p99, p50 plotter.XYs
		for _, pt := range c.points {
			if !pt.keptUp {
				continue
			}
			p99 = append(p99, plotter.XY{X: pt.achieved, Y: ms(pt.p99)})
			p50 = append(p50, plotter.XY{X: pt.achieved, Y: ms(pt.p50)})
			lo, hi = min(lo, ms(pt.p50)), max(hi, ms(pt.p99))
		}
		if len(p99) == 0 {
			continue // kept up with no offered rate: nothing to draw
		}
		col := plotutil.Color(i)
		line, points, err := plotter.NewLinePoints(p99)
		if err != nil {
			return err
		}
		line.Color, line.Width = col, vg.Points(2)
		points.Color, points.Shape = col, draw.CircleGlyph{}
		dashed, err := plotter.NewLine(p50)
		if err != nil {
			return err
		}
		dashed.Color, dashed.Width, dashed.Dashes = faded(col), vg.Points(1.2), []vg.Length{vg.Points(5), vg.Points(3)}
		p.Add(line, points, dashed)
		p.Legend.Add(c.target.name, line, points)
	}
	if hi > 0 {
		// Room above the curves for the legend.
		p.Y.Min, p.Y.Max = lo/1.5, hi*3
	}
	return p.Save(9*vg.Inch, 5.5*vg.Inch, cfg.plotOut)
}

// logTicks labels 1, 2 and 5 of each decade: plot.LogTicks labels only
// powers of ten, too few to read a latency off.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for decade := math.Pow(10, math.Floor(math.Log10(lo))); decade <= hi; decade *= 10 {
		for m := 1.0; m < 10; m++ {
			v := m * decade
			if v < lo || v > hi {
				continue
			}
			label := ""
			if m == 1 || m == 2 || m == 5 {
				label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
	}
	return ticks
}

// ms is a latency in milliseconds, floored so that the log scale never
// meets zero.
func ms(d time.Duration) float64 { return max(float64(d)/float64(time.Millisecond), 0.01) }

func faded(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 170}
}
