// Command plot draws the herd model's arrivals per second, one PNG per
// schedule, the layered chains with and without retryhttp.Handler, the
// budgets through an outage and, from a saved run of bench's cmd/throttle,
// the throttling comparison, into docs/img. It is a module of its own so
// that gonum/plot stays out of the library's dependencies. From the
// repository root:
//
//	(cd docs/plot && go run . -out ../img -throttle ../throttling.json)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log"
	"os"
	"path/filepath"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	out := flag.String("out", "../img", "folder for the PNG files")
	seed := flag.Uint64("seed", 0, "the seed of the jittered runs")
	requests := flag.Int("requests", 3000, "requests per flaky layered chain")
	throttle := flag.String("throttle", "", "the JSON of bench's cmd/throttle to chart (docs/throttling.json); none: no throttling charts")
	only := flag.String("only", "", "draw only these charts: herd, layers, budget or throttle")
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
	runs := map[retryhttp.Jitter]herd.Result{}
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
		if j == retryhttp.NoJitter {
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
