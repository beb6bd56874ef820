// Command plot draws the herd model's arrivals per second, one PNG per
// schedule, the layered chains with and without retryhttp.Handler, the
// budgets through an outage and, from saved runs of bench's cmd/throttle
// and cmd/matrix, the throttling comparison and matrix, into docs/img. It is
// a module of its own so that gonum/plot stays out of the library's
// dependencies. From the repository root:
//
//	(cd lab/plot && go run . -out ../../docs/img -throttle ../runs/throttling.json -matrix ../runs/throttling-matrix.json)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log"
	"os"
	"path/filepath"

	"github.com/herdproof/retryhttp/internal/backoff"
	"github.com/herdproof/retryhttp/internal/herd"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	out := flag.String("out", "../../docs/img", "folder for the PNG files")
	seed := flag.Uint64("seed", 0, "the seed of the jittered runs")
	requests := flag.Int("requests", 3000, "requests per flaky layered chain")
	throttle := flag.String("throttle", "", "the JSON of bench's cmd/throttle to chart (lab/runs/throttling.json); none: no throttling charts")
	matrix := flag.String("matrix", "", "the JSON of bench's cmd/matrix to chart (lab/runs/throttling-matrix.json); none: no matrix charts")
	deadlines := flag.String("deadlines", "", "the JSON of examples/deadlines to chart (docs/deadlines.json); none: no deadline charts")
	only := flag.String("only", "", "draw only these charts: herd, layers, budget, throttle, matrix or deadlines")
	flag.Parse()
	draw := func(name string) bool { return *only == "" || *only == name }
	if draw("herd") {
		herdCharts(*out, *seed)
	}
	if draw("layers") {
		layerCharts(*out, *requests)
	}
	if draw("budget") {
		budgetChart(*out)
	}
	if draw("throttle") && *throttle != "" {
		throttleCharts(*out, *throttle)
	}
	if draw("matrix") && *matrix != "" {
		matrixCharts(*out, *matrix)
	}
	if draw("deadlines") && *deadlines != "" {
		deadlineCharts(*out, *deadlines)
	}
}

// matrixReport is the part of bench's cmd/matrix -json that is charted.
type matrixReport struct {
	Results []struct {
		Workload struct {
			Name     string `json:"name"`
			Capacity []struct {
				At   float64 `json:"at"` // nanoseconds
				Rate float64 `json:"rate"`
			} `json:"capacity"`
			Rates    []float64 `json:"rates"`
			Duration float64   `json:"duration"`
		} `json:"workload"`
		Runs []struct {
			Peer   string `json:"peer"`
			Seed   int    `json:"seed"`
			Series *struct {
				CallerOK []int `json:"caller_ok"`
			} `json:"series"`
		} `json:"runs"`
		Peers []struct {
			Peer      string               `json:"peer"`
			Goodput   struct{ Median any } `json:"goodput"`
			Throttled struct{ Median any } `json:"throttled"`
		} `json:"peers"`
	} `json:"results"`
}

// num reads a median saved as a number ("inf" and null are not charted).
func num(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok
}

// matrixCharts draws docs/throttling.md's matrix charts: each peer's 429s
// over the AWS adaptive mode's and goodput over the best of AWS's and no
// limiter's, workload by workload (the goals' lines drawn across), and
// callers' successes second by second through a capacity that falls 10x
// and comes back.
func matrixCharts(out, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	var rep matrixReport
	if err := json.Unmarshal(b, &rep); err != nil {
		log.Fatal(err)
	}
	peers := []string{"retryhttp", "failsafe-throttler", "none", "aws-adaptive"}
	throttled := plot.New()
	throttled.Title.Text = "429s over the AWS adaptive mode's, per workload (log scale)"
	throttled.X.Label.Text = "workload (docs/throttling.md's table)"
	throttled.Y.Label.Text = "429s / AWS adaptive's"
	throttled.Y.Scale = plot.LogScale{}
	throttled.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	goodput := plot.New()
	goodput.Title.Text = "Goodput minus the AWS adaptive mode's, per workload"
	goodput.X.Label.Text = "workload (docs/throttling.md's table)"
	goodput.Y.Label.Text = "goodput - AWS adaptive's"
	pts := map[string][2]plotter.XYs{}
	for i, r := range rep.Results {
		by := map[string][2]float64{}
		for _, p := range r.Peers {
			g, ok1 := num(p.Goodput.Median)
			t, ok2 := num(p.Throttled.Median)
			if ok1 && ok2 {
				by[p.Peer] = [2]float64{g, t}
			}
		}
		aws, ok := by["aws-adaptive"]
		if !ok {
			continue
		}
		for _, p := range peers {
			v, ok := by[p]
			if !ok {
				continue
			}
			e := pts[p]
			e[0] = append(e[0], plotter.XY{X: float64(i + 1), Y: max(v[1], 1) / max(aws[1], 1)})
			e[1] = append(e[1], plotter.XY{X: float64(i + 1), Y: v[0] - aws[0]})
			pts[p] = e
		}
	}
	for i, p := range peers {
		for k, pl := range []*plot.Plot{throttled, goodput} {
			if p == "aws-adaptive" {
				continue // the reference: 1 and 0 everywhere
			}
			s, err := plotter.NewScatter(pts[p][k])
			if err != nil {
				log.Fatal(err)
			}
			s.Color, s.Shape = plotutil.Color(i), plotutil.Shape(i)
			pl.Add(s)
			pl.Legend.Add(p, s)
		}
	}
	n := float64(len(rep.Results))
	for k, goal := range []struct {
		p    *plot.Plot
		y    float64
		name string
	}{{throttled, 0.8, "goal: at most 0.8"}, {goodput, -0.01, "goal: at least -0.01"}} {
		l, err := plotter.NewLine(plotter.XYs{{X: 1, Y: goal.y}, {X: n, Y: goal.y}})
		if err != nil {
			log.Fatal(err)
		}
		l.Color, l.Dashes = plotutil.Color(len(peers)+k), plotutil.Dashes(1)
		goal.p.Add(l)
		goal.p.Legend.Add(goal.name, l)
	}
	goodput.Legend.Top = false
	goodput.Legend.Left = true
	save(throttled, filepath.Join(out, "matrix-429s.png"))
	save(goodput, filepath.Join(out, "matrix-goodput.png"))

	// Callers' successes through a drop, seed 1.
	const name = "drop10x/10c/2x/5ms/2s"
	for _, r := range rep.Results {
		if r.Workload.Name != name {
			continue
		}
		p := plot.New()
		p.Title.Text = "Successes callers saw, per second: " + name + " (seed 1)"
		p.X.Label.Text = "time (s)"
		p.Y.Label.Text = "successes per second"
		offered := 0.0
		for _, x := range r.Workload.Rates {
			offered += x
		}
		var capacity plotter.XYs
		secs := int(r.Workload.Duration / 1e9)
		for s := range secs {
			c := 0.0
			for _, st := range r.Workload.Capacity {
				if st.At/1e9 <= float64(s) {
					c = st.Rate
				}
			}
			capacity = append(capacity, plotter.XY{X: float64(s + 1), Y: min(c, offered)})
		}
		for i, peer := range peers {
			for _, run := range r.Runs {
				if run.Peer != peer || run.Seed != 1 || run.Series == nil {
					continue
				}
				var xy plotter.XYs
				for s, n := range run.Series.CallerOK {
					xy = append(xy, plotter.XY{X: float64(s + 1), Y: float64(n)})
				}
				l, err := plotter.NewLine(xy)
				if err != nil {
					log.Fatal(err)
				}
				l.Color, l.Dashes = plotutil.Color(i), plotutil.Dashes(i)
				p.Add(l)
				p.Legend.Add(peer, l)
			}
		}
		l, err := plotter.NewLine(capacity)
		if err != nil {
			log.Fatal(err)
		}
		l.Color, l.Dashes = plotutil.Color(len(peers)), plotutil.Dashes(len(peers))
		p.Add(l)
		p.Legend.Add("min(capacity, offered)", l)
		p.Y.Min = 0
		save(p, filepath.Join(out, "matrix-drop10x.png")) // the legend bottom right, clear of the lines
	}
}

// throttleResult is what bench's cmd/throttle -json prints.
type throttleResult struct {
	Capacity float64 `json:"capacity"`
	Runs     []struct {
		Name      string `json:"name"`
		PerSecond []struct {
			Attempts  int `json:"attempts"`
			Throttled int `json:"throttled"`
		} `json:"per_second"`
	} `json:"runs"`
}

// throttleCharts draws docs/throttling.md's charts from a saved run: the
// attempts each client-side limiter lets reach the server, second by
// second, beside its capacity; and the 429s received, added up.
func throttleCharts(out, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	var res throttleResult
	if err := json.Unmarshal(b, &res); err != nil {
		log.Fatal(err)
	}
	rate := plot.New()
	rate.Title.Text = fmt.Sprintf("Attempts reaching a server of capacity %g/s, then %g/s", res.Capacity, res.Capacity/2)
	rate.X.Label.Text = "time (s)"
	rate.Y.Label.Text = "attempts per second"
	total := plot.New()
	total.Title.Text = "429s received, added up (log scale)"
	total.X.Label.Text = "time (s)"
	total.Y.Label.Text = "429s so far"
	total.Y.Scale = plot.LogScale{}
	total.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	// Each implementation keeps its color and dashes in both charts.
	line := func(p *plot.Plot, name string, pts plotter.XYs, i int) {
		l, err := plotter.NewLine(pts)
		if err != nil {
			log.Fatal(err)
		}
		l.Color, l.Dashes = plotutil.Color(i), plotutil.Dashes(i)
		p.Add(l)
		p.Legend.Add(name, l)
	}
	var capacity plotter.XYs
	for i, r := range res.Runs {
		var pts, sum plotter.XYs
		n := 0
		for i, s := range r.PerSecond {
			n += s.Throttled
			sum = append(sum, plotter.XY{X: float64(i + 1), Y: float64(max(n, 1))})
			pts = append(pts, plotter.XY{X: float64(i + 1), Y: float64(s.Attempts)})
			if len(capacity) < len(r.PerSecond) {
				c := res.Capacity
				if 2*i >= len(r.PerSecond) {
					c /= 2
				}
				capacity = append(capacity, plotter.XY{X: float64(i + 1), Y: c})
			}
		}
		line(total, r.Name, sum, i)
		if r.Name != "none" { // over 1,000 a second: off the scale
			line(rate, r.Name, pts, i)
		}
	}
	line(rate, "capacity", capacity, len(res.Runs))
	rate.Y.Min, rate.Y.Max = 0, 3*res.Capacity
	rate.Legend.Top = true
	total.Legend.Top = true
	total.Legend.Left = true
	save(rate, filepath.Join(out, "throttle-attempts.png"))
	save(total, filepath.Join(out, "throttle-429s.png"))
}

// budgetChart draws docs/budget.md's outage timeline: the retries each
// budget pays for, second by second, through 30 s healthy, a 60 s outage and
// 60 s recovered, at 100 requests a second.
func budgetChart(out string) {
	p := plot.New()
	p.Title.Text = "Retries paid per second: 100 requests/s; outage from 30 s to 90 s"
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "retries per second"
	var args []any
	for _, kind := range herd.Budgets {
		var pts plotter.XYs
		for _, s := range herd.BudgetRun(kind, herd.OutageTimeline, 100, 1) {
			pts = append(pts, plotter.XY{X: float64(s.T), Y: float64(s.Retries)})
		}
		args = append(args, kind.Name, pts)
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		log.Fatal(err)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	save(p, filepath.Join(out, "budgets-outage.png"))
}

// layerCharts draws docs/herd.md's layered chains: attempts at the bottom
// per request and the end-to-end success rate, for k = 1 to 4 layers that
// each retry, with and without retryhttp.Handler, in front of a bottom that
// fails 30% of its attempts at random.
func layerCharts(out string, requests int) {
	chains, _ := herd.SignalChains(requests)
	series := func(bottom string, signal bool, y func(herd.ChainResult) float64) plotter.XYs {
		var pts plotter.XYs
		for _, c := range chains {
			if c.Bottom == bottom && c.Signal == signal {
				pts = append(pts, plotter.XY{X: float64(c.Layers), Y: y(c)})
			}
		}
		return pts
	}
	mean := func(c herd.ChainResult) float64 { return c.AttemptsPerRequest }
	most := func(c herd.ChainResult) float64 { return float64(c.MostAttempts) }
	success := func(c herd.ChainResult) float64 { return 100 * c.SuccessRate }

	p := plot.New()
	p.Title.Text = fmt.Sprintf("Bottom fails 30%% of attempts (%d requests): attempts reaching it", requests)
	p.X.Label.Text = "retrying layers (k), 3 attempts each"
	p.Y.Label.Text = "bottom attempts per request"
	p.X.Min, p.X.Max = 0.8, 4.2
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 1, Label: "1"}, {Value: 3, Label: "3"}, {Value: 9, Label: "9"}, {Value: 27, Label: "27"}, {Value: 81, Label: "81"}})
	p.Y.Min, p.Y.Max = 1, 90
	if err := plotutil.AddLinePoints(p,
		"most, without the signal", series("flaky", false, most),
		"most, with retryhttp.Handler", series("flaky", true, most),
		"mean, without the signal", series("flaky", false, mean),
		"mean, with retryhttp.Handler", series("flaky", true, mean)); err != nil {
		log.Fatal(err)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	save(p, filepath.Join(out, "layers-attempts.png"))

	p = plot.New()
	p.Title.Text = fmt.Sprintf("Bottom fails 30%% of attempts (%d requests): requests that succeed", requests)
	p.X.Label.Text = "retrying layers (k), 3 attempts each"
	p.Y.Label.Text = "success end to end (%)"
	p.X.Min, p.X.Max = 0.8, 4.2
	p.Y.Min, p.Y.Max = 90, 100.5
	if err := plotutil.AddLinePoints(p,
		"without the signal", series("flaky", false, success),
		"with retryhttp.Handler", series("flaky", true, success)); err != nil {
		log.Fatal(err)
	}
	p.Legend.Top = false
	p.Legend.Left = true
	save(p, filepath.Join(out, "layers-success.png"))
}

func save(p *plot.Plot, file string) {
	if err := p.Save(6*vg.Inch, 4*vg.Inch, file); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wrote", file)
}

func herdCharts(out string, seed uint64) {
	m := herd.Standard
	runs := map[backoff.Jitter]herd.Result{}
	top := 0 // one y scale for all four charts
	for _, j := range herd.Schedules {
		r := m.Run(j, herd.Rand(seed))
		runs[j] = r
		for _, a := range r.Arrivals {
			top = max(top, a)
		}
	}
	for _, j := range herd.Schedules {
		r := runs[j]
		seconds := len(r.Arrivals) + 5 // each chart runs to its last client
		name := j.String() + " jitter"
		if j == backoff.None {
			name = "no jitter"
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: %d retries, %d rejected after the outage, last client back at %.0f s",
			name, r.Retries, r.Rejected, r.Last.Seconds())
		p.X.Label.Text = "time (s)"
		p.Y.Label.Text = "arrivals per second"
		p.Y.Min, p.Y.Max = 0, float64(top)
		p.X.Min, p.X.Max = 0, float64(seconds)

		pts := make(plotter.XYs, 0, len(r.Arrivals))
		for k, a := range r.Arrivals {
			pts = append(pts, plotter.XY{X: float64(k), Y: float64(a)})
		}
		bars, err := plotter.NewHistogram(pts, len(pts))
		if err != nil {
			log.Fatal(err)
		}
		bars.FillColor = color.RGBA{R: 70, G: 110, B: 180, A: 255}
		bars.LineStyle.Width = 0
		p.Add(bars)

		capacity, err := plotter.NewLine(plotter.XYs{{X: m.Outage.Seconds(), Y: float64(m.Capacity)}, {X: float64(seconds), Y: float64(m.Capacity)}})
		if err != nil {
			log.Fatal(err)
		}
		capacity.Color = color.RGBA{R: 200, A: 255}
		capacity.Width = vg.Points(2)
		p.Add(capacity)
		p.Legend.Add("arrivals", bars)
		p.Legend.Add(fmt.Sprintf("capacity (%d/s after %v)", m.Capacity, m.Outage), capacity)
		p.Legend.Top = true

		file := filepath.Join(out, "herd-"+j.String()+".png")
		if err := p.Save(9*vg.Inch, 4*vg.Inch, file); err != nil {
			log.Fatal(err)
		}
		fmt.Println("wrote", file)
	}
}
