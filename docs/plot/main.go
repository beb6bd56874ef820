// Command plot draws the herd model's arrivals per second, one PNG per
// schedule, into docs/img. It is a module of its own so that gonum/plot stays
// out of the library's dependencies. From the repository root:
//
//	(cd docs/plot && go run . -out ../img)
package main

import (
	"flag"
	"fmt"
	"image/color"
	"log"
	"path/filepath"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

func main() {
	out := flag.String("out", "../img", "folder for the PNG files")
	seed := flag.Uint64("seed", 0, "the seed of the jittered runs")
	flag.Parse()

	m := herd.Standard
	runs := map[retryhttp.Jitter]herd.Result{}
	top := 0 // one y scale for all four charts
	for _, j := range herd.Schedules {
		r := m.Run(j, herd.Rand(*seed))
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

		file := filepath.Join(*out, "herd-"+j.String()+".png")
		if err := p.Save(9*vg.Inch, 4*vg.Inch, file); err != nil {
			log.Fatal(err)
		}
		fmt.Println("wrote", file)
	}
}
