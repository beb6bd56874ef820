package main

import (
	"encoding/json"
	"log"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// deadlinesReport is the part of examples/deadlines -json that is charted.
type deadlinesReport struct {
	Chains []struct {
		Detached  bool    `json:"detached_hop"`
		Propagate bool    `json:"propagate"`
		Busy      float64 `json:"bottom_busy_seconds"`
		BusyAfter float64 `json:"bottom_busy_seconds_after_caller_gave_up"`
	} `json:"chains"`
	Shift struct {
		Runs []struct {
			Name    string       `json:"name"`
			Cuts    [][2]float64 `json:"cuts"`
			Regimes []struct {
				Name     string  `json:"name"`
				P999Ms   float64 `json:"p999_ms"`
				Requests int     `json:"requests"`
			} `json:"regimes"`
		} `json:"runs"`
	} `json:"shift"`
}

// deadlineCharts draws the guide's deadline charts from docs/deadlines.json:
// the bottom's busy seconds in each chain, with and without
// PropagateDeadline (the part after the caller gave up apart), and the
// attempt timeout each cut attempt met, by request, through the shift,
// fixed and measured, with each regime's p99.9.
func deadlineCharts(out, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	var rep deadlinesReport
	if err := json.Unmarshal(b, &rep); err != nil {
		log.Fatal(err)
	}
	busy := plot.New()
	busy.Title.Text = "The bottom's busy seconds: a 4-service chain, 1s caller deadline"
	busy.Y.Label.Text = "busy seconds"
	var in, after plotter.Values
	var names []string
	for _, c := range rep.Chains {
		in = append(in, c.Busy-c.BusyAfter)
		after = append(after, c.BusyAfter)
		name := "all hops cancel"
		if c.Detached {
			name = "a detached proxy"
		}
		if c.Propagate {
			name += ",\npropagated"
		}
		names = append(names, name)
	}
	w := vg.Points(30)
	before, err := plotter.NewBarChart(in, w)
	if err != nil {
		log.Fatal(err)
	}
	before.Color = plotutil.Color(0)
	late, err := plotter.NewBarChart(after, w)
	if err != nil {
		log.Fatal(err)
	}
	late.Color = plotutil.Color(1)
	late.StackOn(before)
	busy.Add(before, late)
	busy.Legend.Add("before the caller gave up", before)
	busy.Legend.Add("after", late)
	busy.Legend.Top = true
	busy.NominalX(names...)

	cuts := plot.New()
	cuts.Title.Text = "Attempt timeout met by each cut attempt, through the shift"
	cuts.X.Label.Text = "request"
	cuts.Y.Label.Text = "timeout (ms, log scale)"
	cuts.Y.Scale = plot.LogScale{}
	cuts.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	for i, r := range rep.Shift.Runs {
		var pts plotter.XYs
		for _, c := range r.Cuts {
			pts = append(pts, plotter.XY{X: c[0], Y: c[1]})
		}
		if len(pts) == 0 {
			continue
		}
		s, err := plotter.NewScatter(pts)
		if err != nil {
			log.Fatal(err)
		}
		s.Color = plotutil.Color(i)
		s.Shape = plotutil.Shape(i)
		s.Radius = vg.Points(1.5)
		cuts.Add(s)
		cuts.Legend.Add(r.Name, s)
		if i == 0 { // each regime's p99.9, once
			var p999 plotter.XYs
			n := 0
			for _, g := range r.Regimes {
				p999 = append(p999, plotter.XY{X: float64(n), Y: g.P999Ms}, plotter.XY{X: float64(n + g.Requests), Y: g.P999Ms})
				n += g.Requests
			}
			l, err := plotter.NewLine(p999)
			if err != nil {
				log.Fatal(err)
			}
			l.Color, l.Dashes = plotutil.Color(2), plotutil.Dashes(1)
			cuts.Add(l)
			cuts.Legend.Add("the regime's p99.9", l)
		}
	}
	cuts.Legend.Top = true
	cuts.Legend.Left = true
	save(busy, filepath.Join(out, "deadlines-chains.png"))
	save(cuts, filepath.Join(out, "deadlines-shift.png"))
}
